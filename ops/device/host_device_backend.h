// HostDeviceBackend: DeviceBackend over host memory, with a HostStream (a thread) as the
// communication stream and MPI, called from that thread, as the collective library. The device
// plane's logic (readiness waits, fusion, the batched copy's work split, completion, timeouts and
// abort) runs over it exactly as over NCCL, which is how machines without a GPU test that logic.
// Not a data plane users select: device tensors go to NCCL or to the staged MPI backend.
//
// Thread safety: as DeviceBackend. MPI is called from the stream's thread on a communicator of
// its own, which needs MPI_THREAD_MULTIPLE: Create refuses a lower level on any rank.
//
// MPI cannot abandon a collective. After an abort (a completion timeout, say) this rank's stream
// drops the collectives queued behind what it was stuck on, so another rank's stream can be left
// inside one of them for good; its thread would then never stop. Destroying a backend whose
// stream is inside a collective after an abort waits for it up to `stuck_limit` (the plane's
// completion timeout: by then every other rank has entered it or aborted), then logs which
// collective is stuck and why and ends the job with MPI_Abort: an error, never a silent hang at
// shutdown.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/device/device_backend.h"
#include "ops/mpi/adasum.h"
#include "runtime/host_stream.h"

namespace gradsync {

class HostDeviceBackend : public DeviceBackend {
 public:
  // Collectives over a duplicate of `comm`, freed by the destructor. Collective over `comm`.
  static Status Create(MPI_Comm comm, std::unique_ptr<HostDeviceBackend>* backend,
                       std::chrono::nanoseconds stuck_limit = kWaitForever);
  ~HostDeviceBackend() override;

  const char* name() const override { return "host"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Stream* stream() override { return &stream_; }
  HostStream* host_stream() { return &stream_; }

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
  Status CheckAsyncError() override { return Status::OK(); }
  void Abort(const Status& status) override { stream_.Abort(status); }

  // Runs `work` on the stream, in order with the collectives; a failure fails the stream with it.
  // For backends built on this one (the staged MPI backend moves device memory around the
  // collectives with it).
  void Enqueue(std::function<Status()> work);

  // The communicator the collectives run on: tests join a collective another rank is stuck in.
  MPI_Comm comm() const { return comm_; }

  // Bytes that every host device backend of the process has allocated and not yet freed: the
  // device memory it stands in for, which a GPU would not take from the host's heap (the soak
  // leaves it out of its bounds on host memory).
  static int64_t DeviceBytesHeld();

  // What the destructor does about a collective still stuck after `stuck_limit`, given the
  // message naming it; by default, logs it and calls MPI_Abort. Null restores the default.
  using StuckCollectiveHandler = void (*)(const std::string& message);
  static void SetStuckCollectiveHandlerForTesting(StuckCollectiveHandler handler);

 private:
  HostDeviceBackend(MPI_Comm comm, std::chrono::nanoseconds stuck_limit);
  // Runs one MPI collective on the stream's thread, named by `call` while it runs.
  Status Collective(const char* call, const std::function<int()>& mpi);
  // Runs `work`, which is or holds collectives, on the stream's thread, named by `call`.
  Status InCollective(const char* call, const std::function<Status()>& work);
  // The destructor's wait, after `aborted`, for the item the stream's thread runs: a collective
  // still running after stuck_limit_ goes to the handler.
  void AwaitStuckCollective(const Status& aborted);

  MPI_Comm comm_;
  std::chrono::nanoseconds stuck_limit_;
  std::atomic<const char*> in_collective_{nullptr};  // the MPI call the stream's thread is in
  std::mutex unfreed_mu_;
  std::vector<void*> unfreed_;  // given to FreeAfterWork, not yet freed by the stream
  int rank_ = 0;
  int size_ = 1;
  AdasumScratch adasum_scratch_;  // the stream's thread's
  HostStream stream_;             // last: its thread stops before the communicator is freed
};

}  // namespace gradsync
