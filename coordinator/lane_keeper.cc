#include "coordinator/lane_keeper.h"

#include <string>

#include "runtime/logging.h"
#include "runtime/mpi_context.h"
#include "runtime/steady_seconds.h"

namespace gradsync {

LaneKeeper::LaneKeeper(const Config& config, CallerLaneTable* lanes)
    : caller_reduce_(config.caller_reduce),
      warning_seconds_(config.stall_warning_seconds),
      shutdown_seconds_(config.stall_shutdown_seconds),
      lanes_(lanes) {}

Status LaneKeeper::GrantAfterRun(int32_t set_id, MPI_Comm data_comm, int64_t piece_bytes,
                                 bool through_shared_memory,
                                 const std::vector<TensorEntry*>& members, bool someone_joined) {
  // No lane while a rank is joined: the question is a collective, and a joined rank may have let
  // its batch go (a batch scoped to its loop), and with it the lane that would make it ask.
  if (someone_joined || lanes_->empty()) return Status::OK();
  if (through_shared_memory) {
    // A lane reduces through MPI messages. Past two ranks of a node, the shared-memory path the
    // bucket took negotiated was faster than that by more than negotiating costs (the 1000 x 1 KB
    // set at 4 ranks: 0.52 to 0.96 of raw MPI negotiated, 1.08 to 1.15 on a lane). Every rank
    // took the same path, so every rank skips the question alike, and such a bucket, negotiated
    // every step, pays no collective for it.
    int ranks = 1;
    GRADSYNC_RETURN_IF_ERROR(MpiResult(MPI_Comm_size(data_comm, &ranks), "MPI_Comm_size"));
    if (ranks > 2) return Status::OK();
  }
  for (const TensorEntry* member : members) {
    Status granted;
    // Under the table's mutex: a caller's thread may destroy a batch meanwhile. The collectives
    // inside pair with the other ranks' background threads alone, never with a caller's.
    lanes_->WithNewest(member->name, [&](CallerLane* lane) {
      // Asked whatever this rank's own state, so that the allreduce pairs up: a joining rank may
      // still be letting its communicator go as the others come back here.
      // Not a 1-byte dtype: the flag that hands a bucket back when a rank joins is a sum in the
      // bucket's dtype, which would wrap to zero at 256 joined ranks.
      const bool fits = lane->process_set == set_id && lane->dtype == member->input.dtype &&
                        lane->elements == member->input.num_elements() &&
                        DataTypeSize(lane->dtype) > 1;
      int want =
          caller_reduce_ && !lane->failed && fits && lane->comm.load() == MPI_COMM_NULL ? 1 : 0;
      int everyone = 0;
      granted = MpiResult(MPI_Allreduce(&want, &everyone, 1, MPI_INT, MPI_MIN, data_comm),
                          "MPI_Allreduce");
      if (!granted.ok() || !everyone) return;
      MPI_Comm comm = MPI_COMM_NULL;
      granted = DupWithReturnedErrors(data_comm, &comm);
      if (!granted.ok()) return;
      lane->piece_bytes = piece_bytes;
      lane->comm = comm;
      Log().debug("bucket '{}' is reduced by its caller from its next step on", lane->name);
    });
    GRADSYNC_RETURN_IF_ERROR(granted);
  }
  return Status::OK();
}

void LaneKeeper::Watch() {
  if (lanes_->empty()) return;
  const double now = SteadySeconds();
  if (now < next_look_) return;
  next_look_ = now + 1.0;
  bool abort = false;
  lanes_->ForEach([&](CallerLane* lane) {
    const double entered = lane->entered_seconds.load(std::memory_order_relaxed);
    if (entered == 0.0) {
      warned_at_.erase(lane);
      return;
    }
    const double waited = now - entered;
    if (shutdown_seconds_ > 0 && waited >= shutdown_seconds_) {
      Log().error(
          "bucket '{}' has waited {:.0f} s in its allreduce on the caller's thread, past "
          "GRADSYNC_STALL_SHUTDOWN_SECONDS: some rank of process set {} never reached "
          "AllreduceBatch::wait() for it (each rank that waits says so). Aborting the job, as the "
          "waiting thread is inside MPI where nothing else can stop it.",
          lane->name, waited, lane->process_set);
      abort = true;
      return;
    }
    if (waited < warning_seconds_) return;
    auto it = warned_at_.find(lane);
    if (it != warned_at_.end() && now - it->second < warning_seconds_) return;
    warned_at_[lane] = now;
    Log().warn(
        "bucket '{}' has waited {:.0f} s in its allreduce on the caller's thread: some rank of "
        "process set {} has not reached AllreduceBatch::wait() for it (each rank that waits says "
        "so; the ranks that do not are the missing ones). The job aborts after "
        "GRADSYNC_STALL_SHUTDOWN_SECONDS.",
        lane->name, waited, lane->process_set);
  });
  if (abort) MPI_Abort(MPI_COMM_WORLD, 1);
}

}  // namespace gradsync
