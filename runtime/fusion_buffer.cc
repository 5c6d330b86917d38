#include "runtime/fusion_buffer.h"

#include <cstdio>
#include <cstdlib>

namespace gradsync {

void FusionBuffer::FreeDeleter::operator()(void* p) const { std::free(p); }

void* FusionBuffer::Get(size_t bytes) {
  if (bytes <= capacity_ && data_) return data_.get();
  const size_t rounded = AlignFusionOffset(bytes == 0 ? kAlignment : bytes);
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    std::fprintf(stderr, "gradsync: cannot allocate a %zu-byte fusion buffer\n", rounded);
    std::abort();
  }
  data_.reset(p);
  capacity_ = rounded;
  return p;
}

}  // namespace gradsync
