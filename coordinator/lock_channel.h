// LockChannel: the exchanges a locked schedule needs (coordinator/locked_schedule.h), behind an
// interface so the lock's logic runs the same over MPI (MpiLockChannel) and over N threads in one
// process (the unit tests' in-process hub).
//
// One exchange per locked bucket: a bitwise AND of a few words, started without waiting and tested
// later, so that the background thread never blocks on a rank that has not reached the bucket.
// Exchanges pair up by the order in which the ranks start them. Beside them, a rank that has
// waited long on an exchange nudges the others, which may not know anyone waits on them.
//
// Every member is called by one thread at a time: the background thread, or a caller's cycle under
// the loop's cycle lock (BackgroundLoop::RunCycleForCaller).
#pragma once

#include <cstdint>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

class LockChannel {
 public:
  virtual ~LockChannel() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Collective, at the same point on every rank (the cycle in which they all lock): makes what the
  // exchanges need. Cheap after the first call.
  virtual Status Open() = 0;
  // Starts the AND of `words` (every rank passes the same length); at most one is in flight.
  virtual Status StartAnd(const std::vector<uint64_t>& words) = 0;
  // Whether the exchange in flight has completed; if so, *words holds the AND across ranks.
  virtual Status TestAnd(bool* done, std::vector<uint64_t>* words) = 0;
  // Tells every other rank that this rank waits on the exchange numbered `sequence`.
  virtual Status Nudge(uint64_t sequence) = 0;
  // The highest sequence any rank nudged about since the last call, or 0 for none.
  virtual Status TakeNudges(uint64_t* highest) = 0;
  // The other ranks not known to have reached exchange `sequence` (counted from 1, as Nudge's),
  // in ascending order: for the error that gives up on them. Exact where the channel sees the
  // others' progress; otherwise those that have not nudged about it by the last TakeNudges (a
  // rank waiting on an exchange nudges once a wait has passed).
  virtual std::vector<int> NotArrived(uint64_t sequence) const = 0;
};

}  // namespace gradsync
