// The batched copy: many tensors moved between their own memory and a fusion buffer in one device
// kernel launch, with a scale folded into each copy (the prescale on the way in; the postscale and
// the division of an average on the way out).
//
// The work split is written once, as functions that both the CUDA kernel (ops/cuda/) and the host
// executor below run, so that the host tests check the very code that decides which block copies
// which bytes of which tensor. The launch has one block per chunk: a tensor of `count` elements
// owns ceil(count / ChunkElements) consecutive chunks, and the lanes (threads) of a block take the
// chunk's elements in a stride of the lane count, so that neighbouring lanes touch neighbouring
// addresses. A chunk copied without scaling moves 16-byte vectors between its first and last
// 16-byte boundaries when source and destination share their alignment, and single elements
// around them; otherwise, and whenever it scales, it goes element by element, scaled as the host
// kernels scale (ops/scale_element.h), so both sides produce the same bits.
//
// Thread safety: pure functions over caller-owned memory. Segments must not overlap each other;
// a segment's source may equal its destination (scaling in place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/scale_element.h"
#include "runtime/host_device.h"

namespace gradsync {

// One tensor's copy: `count` elements from `src` to `dst`, each multiplied by `scale`.
struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t count = 0;
  double scale = 1.0;
};

// Bytes a block copies at most: large enough that a launch over a model's gradients has a few
// thousand blocks, small enough that a tensor of a few KiB still spreads over several.
constexpr int64_t kCopyChunkBytes = 16 * 1024;

GRADSYNC_HOST_DEVICE inline int64_t ChunkElements(size_t element_size) {
  return kCopyChunkBytes / static_cast<int64_t>(element_size);
}

// first_chunk[i] is the launch's index of segment i's first chunk, and first_chunk[n] the number
// of chunks (blocks) of the launch. Empty segments own no chunk.
std::vector<int64_t> PlanCopyChunks(const CopySegment* segments, int num_segments,
                                    size_t element_size);

// The segment that owns `chunk`: the last i with first_chunk[i] <= chunk, skipping empty segments.
GRADSYNC_HOST_DEVICE inline int SegmentOfChunk(const int64_t* first_chunk, int num_segments,
                                               int64_t chunk) {
  int lo = 0;
  int hi = num_segments - 1;
  while (lo < hi) {  // invariant: the owner is in [lo, hi]
    const int mid = lo + (hi - lo + 1) / 2;
    if (first_chunk[mid] <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

namespace batched_copy_internal {

struct alignas(16) Vector16 {
  uint64_t low;
  uint64_t high;
};

GRADSYNC_HOST_DEVICE inline int64_t Misalignment(const void* p) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) & 15u);
}

}  // namespace batched_copy_internal

// Lane `lane` of `lanes` copies its share of chunk `chunk_in_segment` of `segment`. T is the
// storage type of the segment's data type (see DispatchStorageType).
template <typename T>
GRADSYNC_HOST_DEVICE inline void CopyChunk(const CopySegment& segment, int64_t chunk_in_segment,
                                           int lane, int lanes) {
  using batched_copy_internal::Misalignment;
  using batched_copy_internal::Vector16;
  const int64_t per_chunk = ChunkElements(sizeof(T));
  const int64_t begin = chunk_in_segment * per_chunk;
  const int64_t end = begin + per_chunk < segment.count ? begin + per_chunk : segment.count;
  const T* src = static_cast<const T*>(segment.src);
  T* dst = static_cast<T*>(segment.dst);
  if (segment.scale != 1.0) {
    for (int64_t i = begin + lane; i < end; i += lanes)
      dst[i] = ScaleElement(src[i], segment.scale);
    return;
  }
  if (src == dst) return;
  const char* src_bytes = reinterpret_cast<const char*>(src + begin);
  char* dst_bytes = reinterpret_cast<char*>(dst + begin);
  const int64_t bytes = (end - begin) * static_cast<int64_t>(sizeof(T));
  const int64_t offset = Misalignment(src_bytes);
  if (offset != Misalignment(dst_bytes) || offset % sizeof(T) != 0 || bytes < 32) {
    for (int64_t i = begin + lane; i < end; i += lanes) dst[i] = src[i];
    return;
  }
  // Elements before the first 16-byte boundary, the vectors, and the elements after the last.
  const int64_t head = offset == 0 ? 0 : (16 - offset) / static_cast<int64_t>(sizeof(T));
  const int64_t vectors = (bytes - head * static_cast<int64_t>(sizeof(T))) / 16;
  const int64_t tail_begin = begin + head + vectors * 16 / static_cast<int64_t>(sizeof(T));
  for (int64_t i = begin + lane; i < begin + head; i += lanes) dst[i] = src[i];
  const auto* src_vectors = reinterpret_cast<const Vector16*>(src + begin + head);
  auto* dst_vectors = reinterpret_cast<Vector16*>(dst + begin + head);
  for (int64_t v = lane; v < vectors; v += lanes) {
#if defined(__CUDA_ARCH__)
    dst_vectors[v] = src_vectors[v];  // one 128-bit load and store
#else
    std::memcpy(dst_vectors + v, src_vectors + v, sizeof(Vector16));  // no aliasing questions
#endif
  }
  for (int64_t i = tail_begin + lane; i < end; i += lanes) dst[i] = src[i];
}

// Runs chunk `chunk` of a launch: what each block of the kernel does.
template <typename T>
GRADSYNC_HOST_DEVICE inline void RunCopyChunk(const CopySegment* segments,
                                              const int64_t* first_chunk, int num_segments,
                                              int64_t chunk, int lane, int lanes) {
  const int s = SegmentOfChunk(first_chunk, num_segments, chunk);
  CopyChunk<T>(segments[s], chunk - first_chunk[s], lane, lanes);
}

// Calls fn(T{}) with the storage type of `dtype`; false for an unknown data type.
template <typename Fn>
bool DispatchStorageType(DataType dtype, Fn fn) {
  switch (dtype) {
    case DataType::kUInt8:
      fn(uint8_t{});
      return true;
    case DataType::kInt8:
      fn(int8_t{});
      return true;
    case DataType::kInt32:
      fn(int32_t{});
      return true;
    case DataType::kInt64:
      fn(int64_t{});
      return true;
    case DataType::kFloat16:
      fn(Float16Bits{});
      return true;
    case DataType::kBFloat16:
      fn(BFloat16Bits{});
      return true;
    case DataType::kFloat32:
      fn(float{});
      return true;
    case DataType::kFloat64:
      fn(double{});
      return true;
  }
  return false;
}

// The launch run on the host, block after block and lane after lane: what the host tests check,
// and the reference the device tests compare against.
Status RunBatchedCopyOnHost(const std::vector<CopySegment>& segments, DataType dtype, int lanes);

}  // namespace gradsync
