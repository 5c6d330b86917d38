// The memory of a host allreduce entry, whole or kept in pieces (TensorEntry::segments), as the
// fused and in-place paths copy it in and out of their buffers.
//
// Thread safety: pure functions over the entry's memory, which the caller owns for the call.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/scale.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

// Calls visit(memory, at, count) for each run of elements [at, at + count) of the entry's tensor
// within [first, first + count) that lies contiguous in memory: once for a whole tensor, once per
// piece the range touches otherwise. `output` picks the output view's memory of a whole tensor
// (a tensor in pieces is reduced in place).
template <typename Visit>
void ForEachRun(const TensorEntry& entry, bool output, int64_t first, int64_t count,
                Visit&& visit) {
  if (count <= 0) return;
  const size_t element = DataTypeSize(entry.input.dtype);
  if (entry.segments == nullptr) {
    char* base = static_cast<char*>(output ? entry.output.data : entry.input.data);
    visit(base + static_cast<size_t>(first) * element, first, count);
    return;
  }
  const int64_t end = first + count;
  int64_t start = 0;  // of the current piece
  for (size_t s = 0; s < entry.segment_count && start < end; ++s) {
    const HostSegment& piece = entry.segments[s];
    const int64_t from = std::max(first, start), to = std::min(end, start + piece.elements);
    if (from < to) {
      visit(static_cast<char*>(piece.data) + static_cast<size_t>(from - start) * element, from,
            to - from);
    }
    start += piece.elements;
  }
}

// Copies elements [first, first + count) of the entry's input to `buffer`, times `scale`.
inline void CopyEntryIn(const TensorEntry& entry, int64_t first, int64_t count, double scale,
                        char* buffer) {
  const DataType dtype = entry.input.dtype;
  const size_t element = DataTypeSize(dtype);
  ForEachRun(entry, false, first, count, [&](const char* memory, int64_t at, int64_t n) {
    ScaledCopy(memory, buffer + static_cast<size_t>(at - first) * element, n, dtype, scale);
  });
}

// Copies `count` elements from `buffer` to elements [first, first + count) of the entry's
// output, times `scale`.
inline void CopyEntryOut(const char* buffer, int64_t first, int64_t count, double scale,
                         const TensorEntry& entry) {
  const DataType dtype = entry.input.dtype;
  const size_t element = DataTypeSize(dtype);
  ForEachRun(entry, true, first, count, [&](char* memory, int64_t at, int64_t n) {
    ScaledCopy(buffer + static_cast<size_t>(at - first) * element, memory, n, dtype, scale);
  });
}

}  // namespace gradsync
