// LaneKeeper: the background thread's side of the caller lanes (runtime/caller_lanes.h). It grants
// a bucket's lane after the bucket's negotiated run, and it watches the callers reducing on lanes,
// so that one waiting for a rank that never comes is reported and then stopped rather than left
// to hang silently: such a caller is inside MPI, where no error can reach it.
//
// Watch() is called by the loop's thread only; GrantAfterRun by one thread at a time: the
// background thread, or a caller's cycle under the loop's cycle lock
// (BackgroundLoop::RunCycleForCaller).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "gradsync/status.h"
#include "runtime/caller_lanes.h"
#include "runtime/config.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

class LaneKeeper {
 public:
  // `lanes` must outlive the keeper.
  LaneKeeper(const Config& config, CallerLaneTable* lanes);

  // After a host allreduce bucket ran on set `set_id`, on every member of the set alike (the
  // members, stand-ins included, are the negotiated ones, and every rank registered the same
  // lanes): for each member with a lane, one small allreduce over `data_comm` asks every rank
  // whether it wants a communicator for it (it does unless GRADSYNC_CALLER_REDUCE is off, its
  // lane failed, or it still holds one), and when all do, each duplicates `data_comm`
  // for it, to be used in MPI allreduces of at most `piece_bytes` (the set's). A bucket that went
  // through node shared memory (`through_shared_memory`, the same on every rank) in a set of more
  // than two ranks gets no lane and no question: the negotiated path is the faster one there. A
  // lane's bucket runs negotiated only in its first step and while lanes are handed back, so this
  // costs nothing in the steps between. While `someone_joined` (agreed in the cycle's round) no
  // rank asks: a joined rank may have let its batch, and so its lanes, go.
  Status GrantAfterRun(int32_t set_id, MPI_Comm data_comm, int64_t piece_bytes,
                       bool through_shared_memory, const std::vector<TensorEntry*>& members,
                       bool someone_joined);

  // Logs each caller that has waited in a lane's collective past GRADSYNC_STALL_WARNING_SECONDS
  // (again every such period); past GRADSYNC_STALL_SHUTDOWN_SECONDS (unless 0) logs an error and
  // aborts the job. Cheap when no lane exists; looks at most once a second.
  void Watch();

 private:
  bool caller_reduce_;
  double warning_seconds_;
  double shutdown_seconds_;
  CallerLaneTable* lanes_;
  double next_look_ = 0.0;
  std::unordered_map<const CallerLane*, double> warned_at_;  // last warning per waiting lane
};

}  // namespace gradsync
