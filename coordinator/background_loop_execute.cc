// The background loop's execution of a cycle's outcome: fusion into buckets, each run on its
// process set's data plane, with joined ranks' stand-ins, process-set changes and the handing of
// device buckets to the finalizer.
#include <algorithm>

#include "coordinator/background_loop.h"
#include "ops/scale.h"
#include "runtime/logging.h"
#include "runtime/timeline_activity.h"

namespace gradsync {

Status BackgroundLoop::Execute(ProcessSetRuntime* set, const CycleOutcome& outcome) {
  const std::vector<const Response*>& responses = outcome.responses;
  const std::vector<TensorEntry*>& entries = outcome.entries;
  // A fatal response comes last: what was agreed before it still runs (the planner skips the fatal
  // one), then everything fails.
  Status fatal;
  if (!responses.empty() && responses.back()->type == ResponseType::kStallShutdown) {
    fatal = Status::Stalled(responses.back()->error);
  }
  // Checked before anything completes, so that on failure every entry of the outcome is still
  // the caller's to fail.
  bool has_errors = false;
  for (size_t i = 0; i < responses.size(); ++i) {
    const ResponseType type = responses[i]->type;
    has_errors |= type == ResponseType::kError;
    if (entries[i] == nullptr && type != ResponseType::kStallShutdown) {
      // A joined rank takes part in allreduces and barriers it never submitted and ignores the
      // errors of collectives it never submitted.
      const bool joinable = type == ResponseType::kAllreduce || type == ResponseType::kBarrier ||
                            type == ResponseType::kError;
      if (outcome.joined && joinable) continue;
      return Status::Internal("rank " + std::to_string(mpi_.rank()) + " was told to run tensor '" +
                              responses[i]->name + "' that it never submitted");
    }
  }
  for (size_t i = 0; has_errors && i < responses.size(); ++i) {
    if (responses[i]->type == ResponseType::kError && entries[i] != nullptr) {
      Complete({entries[i]}, Status::Mismatch(responses[i]->error));
    }
  }
  stand_ins_used_ = 0;
  // The first host allreduce of a set is a point every member reaches with the same responses.
  if (!set->calibrated()) {
    for (const Response* r : responses) {
      if (r->type == ResponseType::kAllreduce && r->device.kind == DeviceKind::kCpu) {
        set->Calibrate();
        break;
      }
    }
  }
  for (const Bucket& bucket : PlanFusion(responses, set->fusion())) {
    members_.clear();
    for (size_t i : bucket.responses) {
      if (entries[i] != nullptr) {
        members_.push_back(entries[i]);
      } else if (responses[i]->type == ResponseType::kAllreduce) {
        TensorEntry* stand_in = nullptr;
        GRADSYNC_RETURN_IF_ERROR(StandIn(set, *responses[i], &stand_in));
        members_.push_back(stand_in);
      }
    }
    if (members_.empty()) continue;  // a joined rank's barrier: nothing to do
    local_failures_.clear();
    DataPlane* plane = nullptr;
    const Response& first = *responses[bucket.responses.front()];
    const bool traced_device = first.device.kind != DeviceKind::kCpu && timeline_->active();
    Status executed;
    {
      // A device bucket's launch: the host's part, before its phases on the stream.
      TimelineActivity launch(traced_device ? timeline_ : nullptr, members_, "DEVICE_LAUNCH");
      executed = ExecuteBucket(set, first, members_, traced_device, &plane);
    }
    std::shared_ptr<StreamEvent> launched;
    if (plane != nullptr) launched = plane->TakeCompletion();
    if (launched != nullptr) {
      HandToFinalizer(set->id(), plane, executed, std::move(launched), traced_device);
      continue;
    }
    if (!local_failures_.empty()) CompleteLocalFailures();
    if (executed.ok() && first.type == ResponseType::kAllreduce) {
      // Before the handles complete, so that a caller finds its lane granted once it waited. Its
      // failure leaves the bucket negotiated, and the reduced results stand.
      const Status granted =
          lanes_.GrantAfterRun(set->id(), set->data_comm(), set->allreduce_piece_bytes(),
                               set->last_allreduce_shared(), members_, outcome.someone_joined);
      if (!granted.ok()) Log().error("no caller lane for this bucket: {}", granted.ToString());
    }
    Complete(members_, executed);
  }
  if (config_.autotune) {
    set->ObserveForAutotune(responses);
    if (set->id() == 0) config_.cycle_time_ms = set->cycle_time_ms();
  }
  return fatal;
}

namespace {

// A join carries this rank's counters of generated names (unnamed operations, process-set
// changes; see join() in the bindings). While a rank was joined it served the others' unnamed
// allreduces and barriers without counting them, and refused changes counted only where they
// were called, so the counters drifted apart: every rank leaves the join with the highest of
// each, which its operation's received_splits carry back. Every rank runs its join here, alone.
Status AgreeOnNameCounters(MPI_Comm comm, TensorEntry* join) {
  std::vector<int64_t>& counters = join->splits;
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, counters.data(), static_cast<int>(counters.size()),
                                  MPI_INT64_T, MPI_MAX, comm));
  join->state->received_splits = counters;
  return Status::OK();
}

}  // namespace

Status BackgroundLoop::ExecuteBucket(ProcessSetRuntime* set, const Response& first,
                                     const std::vector<TensorEntry*>& members, bool record_phases,
                                     DataPlane** plane_used) {
  TensorEntry* first_entry = members.front();
  DataPlane* plane = nullptr;
  // This rank's own device, not the response's (rank 0's): each rank's GPU is its own.
  GRADSYNC_RETURN_IF_ERROR(set->PlaneFor(first_entry->input.device, &plane));
  *plane_used = plane;  // PlaneFor gives a plane whenever it returns OK
  if (first.device.kind != DeviceKind::kCpu) plane->RecordPhases(record_phases);
  switch (first.type) {
    case ResponseType::kAllreduce:
      return plane->Allreduce(members,
                              {first.dtype, first.reduce_op, first.prescale, first.postscale});
    case ResponseType::kAllgather:
      return plane->Allgather(first_entry, first.first_dims);
    case ResponseType::kBroadcast:
      return plane->Broadcast(first_entry, first.root);
    case ResponseType::kReducescatter:
      return plane->Reducescatter(members,
                                  {first.dtype, first.reduce_op, first.prescale, first.postscale},
                                  &local_failures_);
    case ResponseType::kAlltoall:
      return plane->Alltoall(first_entry);
    case ResponseType::kBarrier:
      // Negotiation already proved every rank reached the barrier.
      return Status::OK();
    case ResponseType::kJoin:
      first_entry->state->result = first.root;
      GRADSYNC_RETURN_IF_ERROR(AgreeOnNameCounters(mpi_.data_comm(), first_entry));
      // Every rank is back: the stand-ins (as large as the gradients) are not needed any more.
      // The join runs alone, after every bucket that used them has completed (device buckets
      // once the finalizer has them done).
      finalizer_.Drain();
      set->ReleaseStandIns();
      stand_ins_.clear();
      stand_ins_used_ = 0;
      return Status::OK();
    case ResponseType::kAddProcessSet:
      return ExecuteAddProcessSet(first_entry);
    case ResponseType::kRemoveProcessSet:
      return ExecuteRemoveProcessSet(first_entry);
    default:
      return Status::Internal("unplannable response type for '" + first.name + "'");
  }
}

Status BackgroundLoop::ExecuteAddProcessSet(TensorEntry* entry) {
  GRADSYNC_RETURN_IF_ERROR(
      CheckSameOnEveryRank(mpi_.data_comm(), entry->splits, "add_process_set"));
  std::vector<int> ranks(entry->splits.begin(), entry->splits.end());  // ints at the call
  const Status valid = NormalizeProcessSetRanks(ranks, mpi_.size(), &ranks);
  if (!valid.ok()) return Status(valid.code(), "add_process_set: " + valid.message());
  int32_t id = 0;
  GRADSYNC_RETURN_IF_ERROR(sets_.Add(ranks, &id));
  entry->state->result = id;
  return Status::OK();
}

Status BackgroundLoop::ExecuteRemoveProcessSet(TensorEntry* entry) {
  GRADSYNC_RETURN_IF_ERROR(
      CheckSameOnEveryRank(mpi_.data_comm(), entry->splits, "remove_process_set"));
  const auto id = static_cast<int32_t>(entry->splits.at(0));
  finalizer_.Drain();  // the set's device work, before its plane goes
  std::vector<TensorEntry*> orphaned;
  GRADSYNC_RETURN_IF_ERROR(sets_.Remove(id, &orphaned));
  if (!orphaned.empty()) {
    Complete(orphaned, Status::Shutdown("process set " + std::to_string(id) +
                                        " was removed while this operation was pending"));
  }
  return Status::OK();
}

Status BackgroundLoop::StandIn(ProcessSetRuntime* set, const Response& response,
                               TensorEntry** stand_in_entry) {
  if (stand_ins_used_ == stand_ins_.size()) stand_ins_.push_back(std::make_unique<StandInEntry>());
  StandInEntry& stand_in = *stand_ins_[stand_ins_used_++];
  TensorEntry& entry = stand_in.entry;
  entry.Clear();
  entry.name = response.name;
  entry.op = OpType::kAllreduce;
  entry.input.dtype = response.dtype;
  entry.input.shape = response.shape;
  entry.input.device = set->OwnDevice(response.device);
  const int64_t count = entry.input.num_elements();
  stand_in.buffer.resize(static_cast<size_t>(entry.input.num_bytes()));
  FillJoinedContribution(stand_in.buffer.data(), count, response.dtype, response.reduce_op,
                         response.prescale);
  entry.input.data = stand_in.buffer.data();
  entry.output = entry.input;
  entry.reduce_op = response.reduce_op;
  entry.prescale = response.prescale;
  entry.postscale = response.postscale;
  *stand_in_entry = &entry;
  if (response.device.kind == DeviceKind::kCpu) return Status::OK();
  DataPlane* plane = nullptr;
  GRADSYNC_RETURN_IF_ERROR(set->PlaneFor(entry.input.device, &plane));
  return plane->AdoptStandIn(&entry);
}

void BackgroundLoop::HandToFinalizer(int32_t set_id, DataPlane* plane, const Status& executed,
                                     std::shared_ptr<StreamEvent> launched, bool traced) {
  device_launched_at_ = std::chrono::steady_clock::now();
  for (const LocalFailure& failure : local_failures_) {
    members_.erase(std::find(members_.begin(), members_.end(), failure.entry));
  }
  if (!executed.ok()) {
    // It failed here alone after launching (an output it could not allocate).
    for (TensorEntry* entry : members_) local_failures_.push_back({entry, executed});
    members_.clear();
  }
  if (!members_.empty()) {
    // First, so that a timeout names the bucket rather than a tensor that failed here alone.
    std::vector<DataPlane::TimedPhase> phases;
    if (traced) phases = plane->TakePhases();
    finalizer_.Add(plane, set_id, members_, launched, std::move(phases), device_launched_at_);
  }
  if (!local_failures_.empty()) {
    finalizer_.AddLocalFailures(plane, set_id, local_failures_, launched);
    local_failures_.clear();
  }
}

void BackgroundLoop::CompleteLocalFailures() {
  for (const LocalFailure& failure : local_failures_) {
    members_.erase(std::find(members_.begin(), members_.end(), failure.entry));
    Complete({failure.entry}, failure.status);
  }
  local_failures_.clear();
}

}  // namespace gradsync
