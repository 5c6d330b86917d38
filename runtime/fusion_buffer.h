// FusionBuffer: persistent, 64-byte aligned host memory that fused collectives pack into. It grows
// to the largest size asked for and is reused for every bucket after that.
//
// Owned and used by the background thread only.
#pragma once

#include <cstddef>
#include <memory>

namespace gradsync {

class FusionBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  // A buffer of at least `bytes` bytes; valid until the next call that needs more.
  void* Get(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> data_;
  size_t capacity_ = 0;
};

// Rounds `offset` up to the fusion alignment.
inline size_t AlignFusionOffset(size_t offset) {
  return (offset + FusionBuffer::kAlignment - 1) & ~(FusionBuffer::kAlignment - 1);
}

}  // namespace gradsync
