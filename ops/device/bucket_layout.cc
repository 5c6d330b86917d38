#include "ops/device/bucket_layout.h"

#include <cstdint>

namespace gradsync {
namespace {

// [begin, begin + bytes) of `a` and of `b` share no byte.
bool Disjoint(const void* a, const void* b, size_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(a);
  const auto second = reinterpret_cast<uintptr_t>(b);
  return first + bytes <= second || second + bytes <= first;
}

}  // namespace

Status LayOutBucket(const std::vector<TensorEntry*>& entries, size_t element_size,
                    BucketLayout* layout) {
  layout->offsets.clear();
  layout->offsets.reserve(entries.size());
  layout->packed = true;
  size_t end = 0;
  for (const TensorEntry* entry : entries) {
    const auto count = static_cast<size_t>(entry->input.num_elements());
    const size_t bytes = count * element_size;
    const size_t offset = bytes == 0 ? end : AlignBucketSegment(end);
    if (count > SIZE_MAX / element_size || offset < end || bytes > SIZE_MAX - offset) {
      return Status::InvalidArgument("the fused size overflows the address space");
    }
    if (offset != end) layout->packed = false;
    layout->offsets.push_back(offset);
    end = offset + bytes;
  }
  layout->bytes = end;
  return Status::OK();
}

bool FindBucketInPlace(const std::vector<TensorEntry*>& entries, const BucketLayout& layout,
                       const void** input, void** output) {
  if (!layout.packed || layout.bytes == 0) return false;
  const char* input_start = nullptr;
  char* output_start = nullptr;
  for (size_t i = 0; i < entries.size(); ++i) {
    const TensorEntry* entry = entries[i];
    if (entry->input.num_elements() == 0) continue;
    const auto* in = static_cast<const char*>(entry->input.data);
    auto* out = static_cast<char*>(entry->output.data);
    if (in == nullptr || out == nullptr) return false;
    if (input_start == nullptr) {
      input_start = in - layout.offsets[i];
      output_start = out - layout.offsets[i];
    } else if (in != input_start + layout.offsets[i] || out != output_start + layout.offsets[i]) {
      return false;
    }
  }
  if (input_start != output_start && !Disjoint(input_start, output_start, layout.bytes)) {
    return false;
  }
  *input = input_start;
  *output = output_start;
  return true;
}

}  // namespace gradsync
