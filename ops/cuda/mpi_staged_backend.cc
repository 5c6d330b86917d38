#include "ops/cuda/mpi_staged_backend.h"

#include <cuda_runtime.h>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include "ops/cuda/cuda_status.h"

namespace gradsync {

bool MpiIsCudaAware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

Status MpiStagedBackend::Create(MPI_Comm comm, int device, std::chrono::nanoseconds stuck_limit,
                                bool copy_tables, std::unique_ptr<MpiStagedBackend>* backend) {
  std::unique_ptr<MpiStagedBackend> created(new MpiStagedBackend(device, MpiIsCudaAware()));
  GRADSYNC_RETURN_IF_ERROR(HostDeviceBackend::Create(comm, &created->host_, stuck_limit));
  // The stream's thread looks at producers' events before it first copies: with no device
  // selected there, those looks would be device 0's, and set up a context on it.
  created->host_->Enqueue(
      [device] { return CudaResult(cudaSetDevice(device), "cudaSetDevice", device); });
  GRADSYNC_CUDA_CALL(cudaSetDevice(device), device);
  cudaStream_t stream = nullptr;
  GRADSYNC_CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), device);
  created->cuda_stream_ = stream;
  GRADSYNC_RETURN_IF_ERROR(CudaBatchedCopier::Create(device, copy_tables, &created->copier_));
  *backend = std::move(created);
  return Status::OK();
}

MpiStagedBackend::~MpiStagedBackend() {
  host_.reset();  // the steps in flight finish (or were dropped by an abort)
  cudaSetDevice(device_);
  copier_.reset();
  if (cuda_stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(cuda_stream_));
  if (staging_ != nullptr) cudaFreeHost(staging_);
}

Status MpiStagedBackend::Allocate(size_t bytes, void** ptr) {
  GRADSYNC_CUDA_CALL(cudaSetDevice(device_), device_);
  const cudaError_t allocated = cudaMalloc(ptr, bytes == 0 ? 1 : bytes);
  if (allocated != cudaSuccess) {
    (void)cudaGetLastError();  // as NcclBackend::Allocate
    return CudaResult(allocated, "cudaMalloc", device_);
  }
  return Status::OK();
}

void MpiStagedBackend::FreeAfterWork(void* ptr) {
  host_->Enqueue([this, ptr] {
    GRADSYNC_RETURN_IF_ERROR(SettleNow());
    return CudaResult(cudaFree(ptr), "cudaFree", device_);
  });
}

Status MpiStagedBackend::Upload(const void* host, void* dst, size_t bytes) {
  Copy(dst, host, bytes);
  return stream_.Record()->Wait(kWaitForever);  // the copy done, not only queued
}

Status MpiStagedBackend::Staging(size_t bytes, char** pinned) {
  if (bytes > staging_capacity_) {
    void* fresh = nullptr;
    GRADSYNC_CUDA_CALL(cudaMallocHost(&fresh, bytes + bytes / 2), device_);
    if (staging_ != nullptr) {
      char* old = staging_;
      host_->Enqueue([this, old] {
        GRADSYNC_RETURN_IF_ERROR(SettleNow());  // a copy from it may still be queued
        return CudaResult(cudaFreeHost(old), "cudaFreeHost", device_);
      });
    }
    staging_ = static_cast<char*>(fresh);
    staging_capacity_ = bytes + bytes / 2;
  }
  *pinned = staging_;
  return Status::OK();
}

void MpiStagedBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  host_->Enqueue([this, dst, src, bytes] {
    GRADSYNC_CUDA_CALL(cudaSetDevice(device_), device_);
    GRADSYNC_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                       static_cast<cudaStream_t>(cuda_stream_)),
                       device_);
    unsettled_ = true;
    return Status::OK();
  });
}

void MpiStagedBackend::Settle() {
  host_->Enqueue([this] { return SettleNow(); });
}

Status MpiStagedBackend::SettleNow() {
  if (!unsettled_) return Status::OK();
  unsettled_ = false;
  GRADSYNC_CUDA_CALL(cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream_)), device_);
  return Status::OK();
}

std::shared_ptr<StreamEvent> MpiStagedBackend::SettledStream::Record() {
  backend_->Settle();
  return backend_->host_->stream()->Record();
}

std::shared_ptr<StreamEvent> MpiStagedBackend::SettledStream::RecordTimed() {
  backend_->Settle();
  return backend_->host_->stream()->RecordTimed();
}

// Device work queued after the wait starts after it, since the thread queues it only then.
void MpiStagedBackend::SettledStream::WaitFor(std::shared_ptr<StreamEvent> event) {
  backend_->host_->stream()->WaitFor(std::move(event));
}

void MpiStagedBackend::SettledStream::Abort(const Status& status) {
  backend_->host_->stream()->Abort(status);
}

Status MpiStagedBackend::BatchedCopy(const std::vector<CopySegment>& segments, DataType dtype) {
  host_->Enqueue([this, segments, dtype] {
    GRADSYNC_CUDA_CALL(cudaSetDevice(device_), device_);
    GRADSYNC_RETURN_IF_ERROR(copier_->Launch(segments, dtype, cuda_stream_));
    unsettled_ = true;
    return Status::OK();
  });
  return Status::OK();
}

Status MpiStagedBackend::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                   ReduceOp op) {
  if (cuda_aware_) {
    // In place on every rank (MPI_IN_PLACE is all ranks' or none's): `send` copied over first.
    if (send != recv) Copy(recv, send, static_cast<size_t>(count) * DataTypeSize(dtype));
    Settle();  // MPI reads what the copies before wrote
    return host_->Allreduce(recv, recv, count, dtype, op);
  }
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  char* pinned = nullptr;
  GRADSYNC_RETURN_IF_ERROR(Staging(bytes, &pinned));
  Copy(pinned, send, bytes);
  Settle();
  GRADSYNC_RETURN_IF_ERROR(host_->Allreduce(pinned, pinned, count, dtype, op));
  Copy(recv, pinned, bytes);
  return Status::OK();
}

Status MpiStagedBackend::Adasum(void* data, DataType dtype, int64_t count,
                                const std::vector<ElementRange>& tensors, double prescale,
                                double postscale) {
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  char* pinned = nullptr;
  GRADSYNC_RETURN_IF_ERROR(Staging(bytes, &pinned));
  Copy(pinned, data, bytes);
  Settle();
  GRADSYNC_RETURN_IF_ERROR(host_->Adasum(pinned, dtype, count, tensors, prescale, postscale));
  Copy(data, pinned, bytes);
  return Status::OK();
}

Status MpiStagedBackend::Allgatherv(const void* send, void* recv,
                                    const std::vector<int64_t>& counts, DataType dtype) {
  if (cuda_aware_) {
    Settle();  // MPI reads what the copies before wrote
    return host_->Allgatherv(send, recv, counts, dtype);
  }
  const size_t element = DataTypeSize(dtype);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const size_t mine = static_cast<size_t>(counts[rank()]) * element;
  char* pinned = nullptr;
  GRADSYNC_RETURN_IF_ERROR(Staging(mine + static_cast<size_t>(total) * element, &pinned));
  Copy(pinned, send, mine);
  Settle();
  GRADSYNC_RETURN_IF_ERROR(host_->Allgatherv(pinned, pinned + mine, counts, dtype));
  Copy(recv, pinned + mine, static_cast<size_t>(total) * element);
  return Status::OK();
}

Status MpiStagedBackend::Broadcast(void* buffer, int64_t count, DataType dtype, int root) {
  if (cuda_aware_) {
    Settle();  // MPI reads what the copies before wrote
    return host_->Broadcast(buffer, count, dtype, root);
  }
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  char* pinned = nullptr;
  GRADSYNC_RETURN_IF_ERROR(Staging(bytes, &pinned));
  if (rank() == root) Copy(pinned, buffer, bytes);
  Settle();
  GRADSYNC_RETURN_IF_ERROR(host_->Broadcast(pinned, count, dtype, root));
  if (rank() != root) Copy(buffer, pinned, bytes);
  return Status::OK();
}

Status MpiStagedBackend::Alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                                   void* recv, const std::vector<int64_t>& recv_counts,
                                   DataType dtype) {
  if (cuda_aware_) {
    Settle();  // MPI reads what the copies before wrote
    return host_->Alltoallv(send, send_counts, recv, recv_counts, dtype);
  }
  const size_t element = DataTypeSize(dtype);
  int64_t sent = 0;
  int64_t received = 0;
  for (int64_t c : send_counts) sent += c;
  for (int64_t c : recv_counts) received += c;
  const size_t send_bytes = static_cast<size_t>(sent) * element;
  const size_t recv_bytes = static_cast<size_t>(received) * element;
  char* pinned = nullptr;
  GRADSYNC_RETURN_IF_ERROR(Staging(send_bytes + recv_bytes, &pinned));
  Copy(pinned, send, send_bytes);
  Settle();
  GRADSYNC_RETURN_IF_ERROR(
      host_->Alltoallv(pinned, send_counts, pinned + send_bytes, recv_counts, dtype));
  Copy(recv, pinned + send_bytes, recv_bytes);
  return Status::OK();
}

Status MpiStagedBackend::ReduceScatterv(const void* send, void* recv,
                                        const std::vector<int64_t>& counts, DataType dtype,
                                        ReduceOp op) {
  if (cuda_aware_) {
    Settle();  // MPI reads what the copies before wrote
    return host_->ReduceScatterv(send, recv, counts, dtype, op);
  }
  const size_t element = DataTypeSize(dtype);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const size_t send_bytes = static_cast<size_t>(total) * element;
  const size_t mine = static_cast<size_t>(counts[rank()]) * element;
  char* pinned = nullptr;
  GRADSYNC_RETURN_IF_ERROR(Staging(send_bytes + mine, &pinned));
  Copy(pinned, send, send_bytes);
  Settle();
  GRADSYNC_RETURN_IF_ERROR(host_->ReduceScatterv(pinned, pinned + send_bytes, counts, dtype, op));
  Copy(recv, pinned + send_bytes, mine);
  return Status::OK();
}

}  // namespace gradsync
