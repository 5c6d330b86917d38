// CudaBatchedCopier: the batched copy launched on a CUDA stream. A launch of up to
// InlineCopyPlan::kMaxSegments segments passes its descriptors (segments and chunk plan) as the
// kernel's parameter: one launch, no copy. A larger one moves them to the device through pinned
// staging blocks that are reused once the copy that read them has run, so that a launch costs no
// synchronization.
//
// While the stream waits for a producer (a backward pass still computing), every launch takes a
// fresh block, and dozens are in flight at once. They finish in the order they were launched
// (one stream), so a launch asks only the oldest whether it is done, and its cost does not grow
// with the blocks in flight.
//
// Thread safety: one thread at a time (the thread that enqueues on the stream).
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/device/batched_copy.h"

namespace gradsync {

class CudaBatchedCopier {
 public:
  // A copier for `device`, the current device, whose kernels are loaded before it returns (see
  // LoadBatchedCopyKernels), so that no launch loads one behind queued work.
  static Status Create(int device, std::unique_ptr<CudaBatchedCopier>* copier);
  ~CudaBatchedCopier();
  CudaBatchedCopier(const CudaBatchedCopier&) = delete;
  CudaBatchedCopier& operator=(const CudaBatchedCopier&) = delete;

  // Enqueues the copy of `segments` (device pointers) on `stream` (a cudaStream_t).
  Status Launch(const std::vector<CopySegment>& segments, DataType dtype, void* stream);

 private:
  struct Staging {
    void* host = nullptr;    // pinned
    void* device = nullptr;  // what the kernel reads
    size_t capacity = 0;
    void* read = nullptr;  // cudaEvent_t recorded after the kernel that read it
  };
  // A block of at least `bytes` whose last kernel has run, put last in flight.
  Status Acquire(size_t bytes, Staging** staging);
  // Moves the blocks whose kernels have run from the front of in_flight_ to free_.
  Status Reclaim();

  explicit CudaBatchedCopier(int device) : device_(device) {}

  int device_;
  std::deque<std::unique_ptr<Staging>> in_flight_;  // in launch order
  std::vector<std::unique_ptr<Staging>> free_;
};

}  // namespace gradsync
