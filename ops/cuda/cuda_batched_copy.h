// CudaBatchedCopier: the batched copy launched on a CUDA stream, with the launch's descriptors
// (segments and chunk plan) moved to the device through pinned staging blocks that are reused
// once the copy that read them has run, so that a launch costs no synchronization.
//
// Thread safety: one thread at a time (the thread that enqueues on the stream).
#pragma once

#include <memory>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/device/batched_copy.h"

namespace gradsync {

class CudaBatchedCopier {
 public:
  explicit CudaBatchedCopier(int device) : device_(device) {}
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
  // A block of at least `bytes` whose last kernel has run.
  Status Acquire(size_t bytes, Staging** staging);

  int device_;
  std::vector<std::unique_ptr<Staging>> blocks_;
};

}  // namespace gradsync
