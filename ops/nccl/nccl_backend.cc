#include "ops/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "ops/cuda/cuda_status.h"
#include "runtime/logging.h"
#include "runtime/mpi_context.h"

namespace gradsync {

bool AllEqual(const std::vector<int64_t>& counts) {
  for (int64_t c : counts) {
    if (c != counts.front()) return false;
  }
  return true;
}

int NcclDataTypeOf(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return ncclUint8;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
  }
  return ncclFloat32;
}

int NcclRedOpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return ncclSum;
    case ReduceOp::kAdasum:  // never a collective's op: NcclBackend::Adasum (adasum.cc)
      break;
  }
  return ncclSum;
}

Status NcclBackend::Create(MPI_Comm comm, int device, bool copy_tables,
                           std::unique_ptr<NcclBackend>* backend) {
  int rank = 0;
  int size = 1;
  GRADSYNC_MPI_CALL(MPI_Comm_rank(comm, &rank));
  GRADSYNC_MPI_CALL(MPI_Comm_size(comm, &size));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  Status ready = CudaResult(cudaSetDevice(device), "cudaSetDevice", device);
  if (ready.ok() && rank == 0) ready = NcclResult(ncclGetUniqueId(&id), "ncclGetUniqueId", device);
  // One agreement before the collectives below: a rank that cannot take part says so, and no rank
  // waits in a collective (or for a communicator) that another never joins.
  int ok = ready.ok() ? 1 : 0;
  int all_ok = 0;
  GRADSYNC_MPI_CALL(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm));
  if (!all_ok) {
    return ready.ok() ? Status(StatusCode::kCudaError,
                               "another rank of the process set could not start NCCL (its log "
                               "says why)")
                      : ready;
  }
  GRADSYNC_MPI_CALL(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
  std::unique_ptr<NcclBackend> created(new NcclBackend(device, rank, size));
  GRADSYNC_MPI_CALL(MPI_Comm_dup(comm, &created->adasum_comm_));
  ncclComm_t nccl_comm = nullptr;
  GRADSYNC_NCCL_CALL(ncclCommInitRank(&nccl_comm, size, id, rank), device);
  created->comm_ = nccl_comm;
  // This rank's own from here: a failure reaches the others through the device plane factory's
  // agreement, which every rank calls next.
  GRADSYNC_RETURN_IF_ERROR(CudaStream::Create(device, &created->stream_));
  GRADSYNC_RETURN_IF_ERROR(CudaBatchedCopier::Create(device, copy_tables, &created->copier_));
  *backend = std::move(created);
  return Status::OK();
}

NcclBackend::~NcclBackend() {
  std::lock_guard<std::timed_mutex> lock(mu_);
  if (adasum_comm_ != MPI_COMM_NULL) MPI_Comm_free(&adasum_comm_);
  cudaSetDevice(device_);
  copier_.reset();  // waits for the kernels that read its staging blocks
  if (adasum_staging_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream()));  // a copy back may read it
    cudaFreeHost(adasum_staging_);
  }
  if (comm_ == nullptr) return;
  if (aborted_) return;  // ncclCommAbort freed it
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream()));
  ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

Status NcclBackend::Enter() {
  if (aborted_) {
    std::lock_guard<std::mutex> state(abort_mu_);
    return abort_status_;
  }
  GRADSYNC_CUDA_CALL(cudaSetDevice(device_), device_);
  return Status::OK();
}

Status NcclBackend::Allocate(size_t bytes, void** ptr) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  GRADSYNC_RETURN_IF_ERROR(Enter());
  const cudaError_t allocated =
      cudaMallocAsync(ptr, bytes == 0 ? 1 : bytes, static_cast<cudaStream_t>(cuda_stream()));
  if (allocated != cudaSuccess) {
    // Out of memory is not sticky, but it stays the thread's last error, which a later kernel
    // launch's check would report as its own: the plane may retry a smaller size.
    (void)cudaGetLastError();
    return CudaResult(allocated, "cudaMallocAsync", device_);
  }
  return Status::OK();
}

void NcclBackend::FreeAfterWork(void* ptr) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  if (aborted_) return;  // stuck work may still hold it: leaked, with the aborted communicator
  cudaSetDevice(device_);
  cudaFreeAsync(ptr, static_cast<cudaStream_t>(cuda_stream()));
}

Status NcclBackend::Upload(const void* host, void* dst, size_t bytes) {
  const auto stream = static_cast<cudaStream_t>(cuda_stream());
  {
    std::lock_guard<std::timed_mutex> lock(mu_);
    GRADSYNC_RETURN_IF_ERROR(Enter());
    GRADSYNC_CUDA_CALL(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream), device_);
  }
  // Outside the lock: the stream may sit behind a collective stuck on a lost peer, and the
  // finalizer's error polls and Abort must still get the lock meanwhile.
  GRADSYNC_CUDA_CALL(cudaStreamSynchronize(stream), device_);
  return Status::OK();
}

Status NcclBackend::BatchedCopy(const std::vector<CopySegment>& segments, DataType dtype) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  GRADSYNC_RETURN_IF_ERROR(Enter());
  return copier_->Launch(segments, dtype, cuda_stream());
}

Status NcclBackend::CheckAsyncError() {
  // Never waits: the lock's holder may be blocked inside NCCL on a lost peer, and the finalizer
  // polling here must reach its deadline and Abort. A busy backend is polled again next time.
  std::unique_lock<std::timed_mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || aborted_ || comm_ == nullptr) return Status::OK();
  ncclResult_t async = ncclSuccess;
  GRADSYNC_NCCL_CALL(ncclCommGetAsyncError(static_cast<ncclComm_t>(comm_), &async), device_);
  if (async == ncclSuccess || async == ncclInProgress) return Status::OK();
  std::string message = std::string("NCCL reported an asynchronous error on cuda:") +
                        std::to_string(device_) + ": " + ncclGetErrorString(async);
  const char* detail = ncclGetLastError(static_cast<ncclComm_t>(comm_));
  if (detail != nullptr && detail[0] != '\0') message += std::string(" (") + detail + ")";
  return Status(StatusCode::kCudaError, message);
}

void NcclBackend::Abort(const Status& status) {
  std::unique_lock<std::timed_mutex> lock(mu_, std::defer_lock);
  const bool locked = lock.try_lock_for(std::chrono::seconds(1));
  {
    // The status before the flag: Enter() reads the status once it sees the flag.
    std::lock_guard<std::mutex> state(abort_mu_);
    if (aborted_) return;
    abort_status_ = status;
    aborted_ = true;
  }
  if (!locked) Log().warn("aborting NCCL on cuda:{} while a call into it is stuck", device_);
  // The stream first: its events then report the abort even while stuck kernels drain.
  stream_->Abort(status);
  cudaSetDevice(device_);
  if (comm_ != nullptr) ncclCommAbort(static_cast<ncclComm_t>(comm_));
}

}  // namespace gradsync
