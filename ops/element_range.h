// A run of elements of a bucket, as the host paths cut buckets into slices, halves and tensors.
#pragma once

#include <cstdint>

namespace gradsync {

// Elements [begin, end) of a bucket.
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

}  // namespace gradsync
