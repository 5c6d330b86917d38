// CallerLanes: communicators of their own for the AllreduceBatch buckets that the caller's thread
// reduces itself, with no negotiation and no hand-off to the background thread
// (docs/architecture.md, "Caller-reduced buckets").
//
// A batch registers a lane for its last bucket under the bucket's name. The first time that bucket
// runs through negotiation, the background thread asks every member of the set whether it wants
// the lane (GRADSYNC_CALLER_REDUCE, not joined, not failed) and, when all do, grants it a duplicate
// of the set's data communicator; it does so in the negotiated order, on every rank alike,
// stand-ins of joined ranks included, so the duplicates pair up. From the next step on, the caller
// reduces the bucket on that communicator in AllreduceBatch::wait(). A joined rank takes part once
// with its identity and a flag set, which takes every rank's lane back to the negotiated path
// together.
//
// Thread safety: the table's members take one mutex. A lane's `comm` is granted by the background
// thread while the bucket is in its hands (before the handle completes) and released by the
// batch's caller (or a joining rank's join()); it is atomic because a joining rank's background
// thread may look at it as join() releases it. `failed` is the caller's; `entered_seconds` is the
// caller's, read by the background thread's watchdog under the table's mutex, which the batch
// takes before it lets a lane go.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "gradsync/types.h"

namespace gradsync {

struct CallerLane {
  std::string name;  // the bucket's, as negotiated
  int32_t process_set = 0;
  DataType dtype = DataType::kFloat32;
  int64_t elements = 0;
  // Granted; null while the bucket takes the negotiated path.
  std::atomic<MPI_Comm> comm{MPI_COMM_NULL};
  // The set's MPI allreduce piece size when `comm` was granted (written before it): every rank's
  // collectives on the lane are issued in the same pieces.
  int64_t piece_bytes = 0;
  std::atomic<bool> failed{false};  // a collective on it failed: never asked for again
  // SteadySeconds() (runtime/steady_seconds.h) at which the caller entered the lane's collective; 0
  // outside it. Joined ranks taking part leave it at 0: waiting for the others is not a stall
  // there.
  std::atomic<double> entered_seconds{0.0};
};

class CallerLaneTable {
 public:
  // At shutdown, while MPI is still usable: frees every granted communicator and forgets every
  // lane; a batch that outlives the runtime finds its lane gone and takes the negotiated path
  // with the next runtime.
  void Close();

  // The newest lane of a name is the one found, so that a batch made anew (the old one not yet
  // destroyed) takes over its predecessor's names on every rank alike.
  void Add(CallerLane* lane);
  // Forgets the lane and frees its communicator; nothing when the lane is not (or no longer) in
  // the table.
  void Remove(CallerLane* lane);
  // Calls `use` with the newest lane registered under `name` (not at all when there is none),
  // under the table's mutex, so that the lane cannot go away meanwhile: the newest may be another
  // batch's than the one whose bucket asks. Cheap when the table is empty.
  void WithNewest(const std::string& name, const std::function<void(CallerLane*)>& use) const;
  // Calls `visit` for every lane, under the table's mutex (so none goes away meanwhile).
  void ForEach(const std::function<void(CallerLane*)>& visit) const;
  bool empty() const { return count_.load(std::memory_order_relaxed) == 0; }

 private:
  mutable std::mutex mu_;
  std::vector<CallerLane*> lanes_;  // oldest first
  std::atomic<size_t> count_{0};
};

// Frees a granted lane communicator and sets it null.
void ReleaseLaneComm(CallerLane* lane);

}  // namespace gradsync
