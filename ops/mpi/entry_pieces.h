// The memory of a host allreduce entry, whole or kept in pieces (TensorEntry::segments), as the
// fused and in-place paths copy it in and out of their buffers; and any byte range of a fused
// bucket, as it is packed and unpacked whole or a part at a time.
//
// Thread safety: pure functions over the entry's memory, which the caller owns for the call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

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

// Where a fused bucket's tensors lie in the fusion buffer: entry t at offsets[t], counts[t]
// elements of elem_size bytes, in order, with gaps between them.
struct FusedLayout {
  const std::vector<TensorEntry*>& entries;
  const std::vector<size_t>& offsets;
  const std::vector<int64_t>& counts;
  size_t elem_size;

  size_t End(size_t t) const { return offsets[t] + static_cast<size_t>(counts[t]) * elem_size; }
};

// Copies bytes [begin, end) of the bucket between the tensors and `buffer`: in (packing, times
// `scale`, with zeros in the gaps, so that reducing them is harmless) or out (unpacking, times
// `scale`). `first` is a tensor index at or before the range, advanced for the next call, so
// consecutive ranges cost no search.
inline void CopyFusedRange(const FusedLayout& layout, char* buffer, size_t begin, size_t end,
                           bool in, double scale, size_t* first) {
  size_t t = *first;
  while (t < layout.entries.size() && layout.End(t) <= begin) ++t;
  *first = t;
  size_t at = begin;
  for (; t < layout.entries.size() && at < end; ++t) {
    const size_t from = std::max(at, layout.offsets[t]);
    const size_t to = std::min(end, layout.End(t));
    if (in && from > at) std::memset(buffer + at, 0, std::min(from, end) - at);
    if (from >= to) {
      at = std::max(at, std::min(from, end));
      continue;
    }
    const auto inside = static_cast<int64_t>((from - layout.offsets[t]) / layout.elem_size);
    const auto count = static_cast<int64_t>((to - from) / layout.elem_size);
    if (in) {
      CopyEntryIn(*layout.entries[t], inside, count, scale, buffer + from);
    } else {
      CopyEntryOut(buffer + from, inside, count, scale, *layout.entries[t]);
    }
    at = to;
  }
  if (in && at < end) std::memset(buffer + at, 0, end - at);
}

}  // namespace gradsync
