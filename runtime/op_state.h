// OpState: the shared completion record behind a public Handle.
//
// Owns the final Status, the completion flag and an optional callback. Only the background thread
// completes it, once, in two steps (below); done/status/Wait* may be called from any thread at any
// time. The callback has returned before waiters see the operation done.
//
// Completion costs no lock and no wake-up per operation: the flag is an atomic, and every sleeping
// waiter of every operation sleeps on one process-wide condition that AnnounceCompletions() wakes
// once per completed batch (AnnounceLaunches() once per launched bucket), and only when someone
// sleeps. A sleeper woken for another operation looks at its own and sleeps again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gradsync/status.h"
#include "runtime/stream.h"

namespace gradsync {

class OpState {
 public:
  using Callback = std::function<void(const Status&)>;

  explicit OpState(Callback callback = nullptr) : callback_(std::move(callback)) {}

  // Makes *state a pending operation with `callback`. The object it points to is reused when
  // nothing else holds it any more (its handles are gone), so a training loop that drops its
  // handles each step allocates no OpState; otherwise a new one is made.
  static void Renew(std::shared_ptr<OpState>* state, Callback callback);

  // Completion in steps, so that many operations complete at once: RunCallback() and Record()
  // every one, then AnnounceCompletions() once. A thread waiting on the first then finds the rest
  // already done instead of sleeping once per operation. A second Record() aborts.
  void RunCallback(const Status& status);
  void Record(const Status& status);
  // Wakes the threads sleeping in Wait/WaitFor on any operation Record()ed before this call.
  static void AnnounceCompletions();

  bool done() const { return done_.load(std::memory_order_acquire); }
  // Blocks until Record() and AnnounceCompletions(); returns the final status, which stays valid
  // and unchanged while the caller holds this OpState (Renew reuses only unheld ones).
  const Status& Wait();
  // Returns false if `timeout` passes first; otherwise true and *status holds the result.
  bool WaitFor(std::chrono::nanoseconds timeout, Status* status);
  // The final status once done; OK while pending.
  Status status() const { return done() ? status_ : Status::OK(); }

  // Device operations, for stream-ordered completion: the event that completes once the
  // operation's work has run on the communication stream. Set once, by the thread that launches
  // the work, before the operation completes; a second call aborts. AnnounceLaunches(), once
  // after a bucket's members are all set, wakes the threads sleeping in WaitLaunched.
  void SetLaunched(std::shared_ptr<StreamEvent> event);
  static void AnnounceLaunches();
  // Blocks until the work is launched (never until it has run) or the operation is done, for
  // at most `timeout`; returns the event, or null when the operation completed without one (it
  // ran on the host or failed before launch) or the timeout passed first (*timed_out is set).
  // A device operation's waiter polls for a while before it sleeps, as Wait's does.
  std::shared_ptr<StreamEvent> WaitLaunched(std::chrono::nanoseconds timeout, bool* timed_out);
  // Whether SetLaunched has given the work's event. Never blocks.
  bool launched() const { return has_launched_.load(std::memory_order_acquire); }

 private:
  // First, so that with make_shared's control block what every operation touches (the flag, the
  // callback's emptiness, the status code) shares one cache line.
  std::atomic<bool> done_{false};
  Callback callback_;
  Status status_;  // written once, before done_ is set
  // A flag and a plain pointer, not an atomic shared_ptr (whose loads and stores take a lock from
  // a process-wide pool, at every operation's launch and reuse): the pointer is written once,
  // before the flag is set, and read only after the flag is seen set.
  std::atomic<bool> has_launched_{false};
  std::shared_ptr<StreamEvent> launched_;

 public:
  // Whether the operation's tensors are device memory, set by the submitting thread before the
  // operation is queued: Wait and WaitFor then poll for a while before they sleep.
  bool on_device = false;
  // Allgather, reducescatter, alltoall: the output shape, set by the background thread before
  // Record().
  std::vector<int64_t> output_shape;
  // Alltoall: rows received from each rank, in rank order; set before Record().
  std::vector<int64_t> received_splits;
  // Join: the last rank to join. Add process set: the new set's id. Set before Record().
  int32_t result = 0;
};

}  // namespace gradsync
