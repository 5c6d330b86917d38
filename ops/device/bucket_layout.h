// BucketLayout: where a fused device bucket's tensors sit in the fusion buffer, and whether the
// caller's own memory already holds them that way, so that the bucket can be reduced where it
// lies instead of copied in and out.
//
// Every rank computes the same layout from the bucket's shapes alone (the negotiated or locked
// plan gives every rank the same entries in the same order), so a rank that reduces its tensors
// in place and a rank that reduces them through its fusion buffer put each element at the same
// offset of the same collective. Tensors are packed in bucket order, each starting on a
// kSegmentAlignment boundary (the batched copy's vector width), and the collective ends with the
// last tensor's last element.
//
// Thread safety: plain functions over the caller's data.
#pragma once

#include <cstddef>
#include <vector>

#include "gradsync/status.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

struct BucketLayout {
  static constexpr size_t kSegmentAlignment = 16;

  std::vector<size_t> offsets;  // bytes from the bucket's start, one per entry
  size_t bytes = 0;             // up to the end of the last tensor
  // No gap between tensors: each one but the last fills a whole number of alignment units. Only
  // then can tensors that lie back to back in the caller's memory be the bucket itself.
  bool packed = true;
};

// `offset` rounded up to the next kSegmentAlignment boundary: where a tensor after it starts.
inline size_t AlignBucketSegment(size_t offset) {
  return (offset + BucketLayout::kSegmentAlignment - 1) & ~(BucketLayout::kSegmentAlignment - 1);
}

// The layout of `entries` (their inputs' element counts, `element_size` bytes each);
// InvalidArgument when it would not fit the address space.
Status LayOutBucket(const std::vector<TensorEntry*>& entries, size_t element_size,
                    BucketLayout* layout);

// Where the bucket lies already in the caller's memory: true, with the first bytes of the
// entries' inputs and of their outputs, when the layout is packed, the bucket holds at least one
// element, and each entry's input and output sit at its layout offset from those starts; the
// outputs' range either is the inputs' (in place) or does not overlap it. Empty entries may sit
// anywhere.
bool FindBucketInPlace(const std::vector<TensorEntry*>& entries, const BucketLayout& layout,
                       const void** input, void** output);

}  // namespace gradsync
