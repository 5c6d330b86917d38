// NcclBackend: DeviceBackend over one NCCL communicator of a process set on one device, with a
// non-blocking highest-priority CUDA stream as the communication stream. Each collective lives in
// its own file (allreduce.cc, allgather.cc, broadcast.cc, alltoall.cc, reducescatter.cc), as the
// MPI plane's do.
//
// Adasum, which NCCL does not offer, is combined by the host over MPI (adasum.cc): the bucket is
// staged through pinned host memory, and the call returns only once the combination is done and
// its copy back queued, having waited for the stream (the bucket's producers and the work queued
// before it) on the launching thread, as an Adasum bucket of host tensors holds that thread for
// its MPI exchanges.
//
// Abort calls ncclCommAbort, which releases kernels stuck waiting on peers, and fails the stream.
// A mutex keeps it from racing with an enqueue on the background thread; when that enqueue is
// itself stuck inside NCCL (connecting to a peer that is gone), Abort stops waiting for the mutex
// after a second and aborts anyway, which is what releases the enqueue.
//
// Thread safety: as DeviceBackend.
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "ops/cuda/cuda_batched_copy.h"
#include "ops/cuda/cuda_stream.h"
#include "ops/device/device_backend.h"
#include "ops/mpi/adasum.h"

namespace gradsync {

class NcclBackend : public DeviceBackend {
 public:
  // Collective over `comm`: rank 0 makes the NCCL unique id, MPI broadcasts it, every rank joins
  // the communicator on `device`. A failure before the collectives (selecting the device, making
  // the id) fails every rank; one after them (the stream, the copier) fails this rank alone, which
  // the caller's agreement then tells the others. `copy_tables`: as CudaBatchedCopier::Create's
  // `tables`.
  static Status Create(MPI_Comm comm, int device, bool copy_tables,
                       std::unique_ptr<NcclBackend>* backend);
  ~NcclBackend() override;

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Stream* stream() override { return stream_.get(); }

  Status Allocate(size_t bytes, void** ptr) override;
  void FreeAfterWork(void* ptr) override;
  Status Upload(const void* host, void* dst, size_t bytes) override;
  Status BatchedCopy(const std::vector<CopySegment>& segments, DataType dtype) override;
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype) override;
  Status Broadcast(void* buffer, int64_t count, DataType dtype, int root) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype) override;
  Status ReduceScatterv(const void* send, void* recv, const std::vector<int64_t>& counts,
                        DataType dtype, ReduceOp op) override;
  Status Adasum(void* data, DataType dtype, int64_t count, const std::vector<ElementRange>& tensors,
                double prescale, double postscale) override;
  Status CheckAsyncError() override;
  void Abort(const Status& status) override;

 private:
  NcclBackend(int device, int rank, int size) : device_(device), rank_(rank), size_(size) {}
  // Makes the calling thread's current device this backend's; OK or the abort's status.
  Status Enter();
  void* cuda_stream() const { return stream_->native(); }

  int device_;
  int rank_;
  int size_;
  void* comm_ = nullptr;  // ncclComm_t
  std::unique_ptr<CudaStream> stream_;
  std::unique_ptr<CudaBatchedCopier> copier_;
  std::timed_mutex mu_;  // comm_'s use against Abort
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;  // abort_status_
  Status abort_status_;
  // Adasum's: MPI over the same ranks (a duplicate of Create's communicator), pinned host memory
  // the buckets are staged through, and the combination's working memory.
  MPI_Comm adasum_comm_ = MPI_COMM_NULL;
  char* adasum_staging_ = nullptr;
  size_t adasum_staging_capacity_ = 0;
  AdasumScratch adasum_scratch_;
};

// Whether every rank's count is the same: one NCCL collective then serves, not a group.
bool AllEqual(const std::vector<int64_t>& counts);

// The NCCL value of a gradsync dtype and reduce op (never kAverage).
int NcclDataTypeOf(DataType dtype);
int NcclRedOpOf(ReduceOp op);

}  // namespace gradsync
