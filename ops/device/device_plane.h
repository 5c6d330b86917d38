// DevicePlane: the data plane for device tensors, written once over DeviceBackend so that the same
// logic runs over NCCL, over MPI staged through host memory, and, in the tests of machines without
// a GPU, over host threads and MPI.
//
// Each call returns once its work is queued on the backend's communication stream, in this order:
// waits for the inputs' producers (each entry's `ready` event, recorded now for a locked
// bucket's entries; the stream waits, not the caller),
// the batched copy into the fusion buffer with the prescale folded in, one collective, the batched
// copy out with the postscale (and an average's division) folded in, and a recorded event that
// TakeCompletion() hands to the finalizer. A bucket of one tensor, or one whose tensors already
// lie back to back in memory as the fusion buffer would hold them (ops/device/bucket_layout.h),
// skips the copies and is reduced where it lies (scaled in place when it must be). An Adasum
// bucket, which no collective library reduces, is combined by the backend's host side instead of
// the collective (DeviceBackend::Adasum), over the bucket packed without gaps. The fusion
// buffer is the backend's memory, kept and reused; it grows when a bucket needs more, the old one
// freed once the work using it has run.
//
// After Abort every call fails with the abort's status: the communicator may be left in any state.
//
// Thread safety: as DataPlane.
#pragma once

#include <mpi.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/data_plane.h"
#include "ops/device/bucket_layout.h"
#include "ops/device/device_backend.h"

namespace gradsync {

class DevicePlane : public DataPlane {
 public:
  // `comm` (the process set's data communicator, host MPI) exchanges the small host-side values
  // some collectives need first (alltoall's splits). `timeout`: completion_timeout().
  DevicePlane(std::unique_ptr<DeviceBackend> backend, MPI_Comm comm,
              std::chrono::nanoseconds timeout);
  ~DevicePlane() override;

  Status Allreduce(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) override;
  Status Allgather(TensorEntry* entry, const std::vector<int64_t>& first_dims) override;
  Status Broadcast(TensorEntry* entry, int root) override;
  Status Reducescatter(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                       std::vector<LocalFailure>* local_failures) override;
  Status Alltoall(TensorEntry* entry) override;

  Status AdoptStandIn(TensorEntry* stand_in) override;
  void ReleaseStandIns() override;
  std::shared_ptr<StreamEvent> TakeCompletion() override;
  void RecordPhases(bool on) override { record_phases_ = on; }
  std::vector<TimedPhase> TakePhases() override { return std::move(phases_); }
  std::chrono::nanoseconds completion_timeout() const override { return timeout_; }
  Status CheckAsyncError() override;
  void Abort(const Status& status) override;

  DeviceBackend* backend() { return backend_.get(); }

 private:
  // OK, or the abort's status once aborted.
  Status Failed() const;
  // Where every collective starts: drops the event of a call whose caller did not take it, so that
  // TakeCompletion gives this call's or none, then Failed().
  Status BeginCall();
  // Every entry's input has its producer's readiness waited for on the stream. Entries whose
  // producer stream is not yet recorded on (a locked bucket's, ops/device/producer_readiness.h)
  // get one event per stream for all of them first. A failure to record aborts the plane, as a
  // failed launch does: the other ranks go on into the collective.
  Status WaitForInputs(const std::vector<TensorEntry*>& entries);
  // While phases are recorded: a timed event ending the phase `ended` (the stream's work so far).
  void MarkPhase(const char* ended);
  // Records the launch's completion event, which ends the phase `last` (timed while phases are
  // recorded), and gives it to the entries' handles, but for those in failed_here_: a handle that
  // will fail must not let synchronize_stream order a consumer after the launch as if it had not.
  Status FinishLaunch(const std::vector<TensorEntry*>& entries, const char* last);
  // The two ways to reduce a bucket laid out in layout_ (`count` elements, more than none).
  Status AllreduceWhereItLies(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                              const void* input, void* output, int64_t count);
  Status AllreduceFused(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                        int64_t count);
  // An Adasum bucket: its layout_ computed, its inputs waited for.
  Status AllreduceAdasum(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec);
  // An average is reduced as a sum, then divided in the postscale.
  static ReduceOp CollectiveOp(const ReduceSpec& spec);
  double Postscale(const ReduceSpec& spec) const;
  // The fusion buffer, at least `bytes` large.
  Status FusionBuffer(size_t bytes, void** buffer);
  // `status` with the collective and the tensors in front.
  static Status InContext(const Status& status, const std::string& collective,
                          const std::vector<TensorEntry*>& entries);

  std::unique_ptr<DeviceBackend> backend_;
  MPI_Comm comm_;
  std::chrono::nanoseconds timeout_;
  void* fusion_ = nullptr;
  size_t fusion_capacity_ = 0;
  // Joined ranks' stand-ins in the backend's memory, by the host buffer they were made from: the
  // background thread refills the same host buffers every cycle, so one block each is reused.
  struct StandInMemory {
    const void* host;
    void* memory;
    size_t bytes;
  };
  std::vector<StandInMemory> stand_ins_;
  std::shared_ptr<StreamEvent> completion_;
  // The call's entries whose output could not be allocated (they fail on this rank alone).
  std::vector<const TensorEntry*> failed_here_;
  bool record_phases_ = false;
  std::vector<TimedPhase> phases_;            // the last launch's, while recorded
  BucketLayout layout_;                       // the last allreduce's
  std::vector<CopySegment> segments_;         // scratch
  std::vector<ElementRange> adasum_tensors_;  // AllreduceAdasum's
  std::vector<StreamEvent*> ready_scratch_;   // WaitForInputs'
  mutable std::mutex abort_mu_;
  bool aborted_ = false;
  Status abort_status_;
};

}  // namespace gradsync
