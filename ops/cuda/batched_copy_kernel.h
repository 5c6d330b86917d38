// The batched copy (ops/device/batched_copy.h) launched as one CUDA kernel on a stream. Free of
// CUDA includes: the stream travels as an opaque pointer (a cudaStream_t), so host-only code can
// include this header.
//
// Thread safety: any thread; the launch is ordered on `stream` like any other kernel.
#pragma once

#include <cstdint>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/device/batched_copy.h"

namespace gradsync {

// Copies every segment as the plan `device_first_chunk` (PlanCopyChunks, num_segments + 1 values,
// total_chunks the last) lays out. `device_segments` and `device_first_chunk` are in device memory
// and must stay valid until the kernel has run; the segments' pointers are device pointers. A
// launch error is returned with CUDA's message; errors while the kernel runs surface on the stream.
Status LaunchBatchedCopy(const CopySegment* device_segments, const int64_t* device_first_chunk,
                         int num_segments, int64_t total_chunks, DataType dtype, void* stream);

// A small batch's segments and plan, passed to the kernel by value as its parameter (under the
// 4 KiB every CUDA device accepts), so that its launch needs no host-to-device copy first.
struct InlineCopyPlan {
  static constexpr int kMaxSegments = 96;
  CopySegment segments[kMaxSegments];
  int64_t first_chunk[kMaxSegments + 1];
  int num_segments = 0;
};

// Loads every batched copy kernel into the current device's context now. CUDA loads a kernel at
// its first launch by default (lazy loading), and loading may wait for the device's running
// work: a first copy queued behind a producer that is still computing would block the host
// until the producer finished, which is what a launch must never do.
Status LoadBatchedCopyKernels();

// As LaunchBatchedCopy, with the segments (host values of device pointers) and the plan in `plan`.
Status LaunchInlineBatchedCopy(const InlineCopyPlan& plan, DataType dtype, void* stream);

}  // namespace gradsync
