// Adasum on the NCCL backend. NCCL has no Adasum and its kernels cannot compute one, so the bucket
// is copied into pinned host memory, combined there by AdasumBuffer over MPI (ops/mpi/adasum.h),
// and copied back, as Horovod combines its GPU Adasum buckets on the host between nodes. The host
// must wait for the device before it reads the bucket; it does so here, on the launching thread,
// outside the lock that Abort takes, so that an abort can still release a collective queued
// earlier that a peer never joined, and it does not start the exchange once the backend is
// aborted.
#include <cuda_runtime.h>

#include "ops/cuda/cuda_status.h"
#include "ops/nccl/nccl_backend.h"

namespace gradsync {

Status NcclBackend::Adasum(void* data, DataType dtype, int64_t count,
                           const std::vector<ElementRange>& tensors, double prescale,
                           double postscale) {
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  const auto stream = static_cast<cudaStream_t>(cuda_stream());
  // Only the launching thread touches the staging memory. Growing it waits for the last bucket's
  // copy back, which may still read the old memory, and frees pinned memory, which can wait for
  // the device too: both outside the lock, which the finalizer's checks and Abort take.
  if (bytes > adasum_staging_capacity_) {
    GRADSYNC_RETURN_IF_ERROR(Enter());
    GRADSYNC_CUDA_CALL(cudaStreamSynchronize(stream), device_);
    if (adasum_staging_ != nullptr) GRADSYNC_CUDA_CALL(cudaFreeHost(adasum_staging_), device_);
    adasum_staging_ = nullptr;
    adasum_staging_capacity_ = 0;
    void* fresh = nullptr;
    GRADSYNC_CUDA_CALL(cudaMallocHost(&fresh, bytes + bytes / 2), device_);
    adasum_staging_ = static_cast<char*>(fresh);
    adasum_staging_capacity_ = bytes + bytes / 2;
  }
  {
    std::lock_guard<std::timed_mutex> lock(mu_);
    GRADSYNC_RETURN_IF_ERROR(Enter());
    GRADSYNC_CUDA_CALL(
        cudaMemcpyAsync(adasum_staging_, data, bytes, cudaMemcpyDeviceToHost, stream), device_);
  }
  GRADSYNC_CUDA_CALL(cudaStreamSynchronize(stream), device_);
  // An abort is what releases a stream stuck behind a collective a peer never joined; that peer
  // will not join this exchange either.
  GRADSYNC_RETURN_IF_ERROR(Enter());
  GRADSYNC_RETURN_IF_ERROR(AdasumBuffer(adasum_staging_, dtype, count, tensors, prescale, postscale,
                                        adasum_comm_, &adasum_scratch_));
  std::lock_guard<std::timed_mutex> lock(mu_);
  GRADSYNC_RETURN_IF_ERROR(Enter());
  GRADSYNC_CUDA_CALL(cudaMemcpyAsync(data, adasum_staging_, bytes, cudaMemcpyHostToDevice, stream),
                     device_);
  return Status::OK();
}

}  // namespace gradsync
