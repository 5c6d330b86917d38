// MpiStagedBackend (GRADSYNC_GPU_BACKEND=mpi): device tensors reduced with MPI. The batched copy
// runs on the device, on a CUDA stream of this backend's own; the collective runs on host memory
// through HostDeviceBackend, whose thread is the communication stream: it waits for the
// producers' events, drives each step's device work to completion and then calls MPI. Without a
// CUDA-aware MPI, each collective's data is staged through pinned host buffers (device to host
// before, host to device after); with one (detected at creation), MPI reads and writes device
// memory directly.
//
// What it costs: one host thread per process set and device, and host waits on that thread
// (never on the caller's or the background thread). The thread queues device work (batched copies,
// staging copies) on its CUDA stream without waiting for it, and synchronizes that stream only
// where the host needs the device's results: before an MPI call reads or writes staged or device
// memory, and before an event of the stream completes. A fused bucket thus costs two device round
// trips (copy in and stage out; stage in and copy out), as staging one tensor by hand does. What it
// gives: a fallback where NCCL is absent, and ranks that share one GPU, which NCCL refuses. Its
// completion events are host events, so stream-ordered completion waits on the host
// (docs/user_guide.md says so).
//
// Thread safety: as DeviceBackend.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>

#include "ops/cuda/cuda_batched_copy.h"
#include "ops/device/device_backend.h"
#include "ops/device/host_device_backend.h"

namespace gradsync {

class MpiStagedBackend : public DeviceBackend {
 public:
  // Collective over `comm`. `stuck_limit`: as HostDeviceBackend::Create's. `copy_tables`: as
  // CudaBatchedCopier::Create's `tables`.
  static Status Create(MPI_Comm comm, int device, std::chrono::nanoseconds stuck_limit,
                       bool copy_tables, std::unique_ptr<MpiStagedBackend>* backend);
  ~MpiStagedBackend() override;

  const char* name() const override { return "mpi"; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  Stream* stream() override { return &stream_; }
  bool cuda_aware() const { return cuda_aware_; }

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
  // Staged through pinned host memory even where MPI is CUDA-aware: the host computes it.
  Status Adasum(void* data, DataType dtype, int64_t count, const std::vector<ElementRange>& tensors,
                double prescale, double postscale) override;
  Status CheckAsyncError() override { return Status::OK(); }
  void Abort(const Status& status) override { host_->Abort(status); }

 private:
  // The host stream, with each event recorded only after the device work queued before it has
  // finished: the plane's completion and phase events, and the waits of other streams, mean
  // what they say.
  class SettledStream : public Stream {
   public:
    explicit SettledStream(MpiStagedBackend* backend) : backend_(backend) {}
    std::shared_ptr<StreamEvent> Record() override;
    std::shared_ptr<StreamEvent> RecordTimed() override;
    void WaitFor(std::shared_ptr<StreamEvent> event) override;
    void Abort(const Status& status) override;

   private:
    MpiStagedBackend* backend_;
  };

  MpiStagedBackend(int device, bool cuda_aware)
      : device_(device), cuda_aware_(cuda_aware), stream_(this) {}
  // Pinned host memory of at least `bytes`, valid for work enqueued from now on.
  Status Staging(size_t bytes, char** pinned);
  // Enqueues a copy between host and device memory on the CUDA stream, not waited for.
  void Copy(void* dst, const void* src, size_t bytes);
  // Enqueues a step that waits for the device work queued so far, where there is any: before
  // the host reads or writes what that work touches.
  void Settle();
  // On the stream's thread: waits for the CUDA stream if device work was queued since the last
  // wait.
  Status SettleNow();

  int device_;
  bool cuda_aware_;
  void* cuda_stream_ = nullptr;  // cudaStream_t for the copies and kernels
  std::unique_ptr<CudaBatchedCopier> copier_;
  char* staging_ = nullptr;
  size_t staging_capacity_ = 0;
  bool unsettled_ = false;  // device work queued since the last wait; the stream's thread's own
  SettledStream stream_;
  std::unique_ptr<HostDeviceBackend> host_;  // last: its thread stops first
};

// Whether the MPI library reads and writes device memory itself (Open MPI's
// MPIX_Query_cuda_support); false where the library cannot say.
bool MpiIsCudaAware();

}  // namespace gradsync
