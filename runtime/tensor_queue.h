// TensorQueue: hands entries from caller threads to the background thread, and owns every entry
// in flight (from Push until Release), by name, so that a duplicate name fails at enqueue.
// Released entries, once their handles are completed, are recycled into a pool that NewEntry
// draws from: once a training loop has run a step, enqueueing allocates nothing here.
//
// NewEntry, Push and Close may be called from any thread; WaitForWork, Drain and InFlight only from
// the background thread, which may use a drained entry until it recycles it; Release and Recycle
// from one thread at a time (the background loop's completions, on its thread or the
// finalizer's, take a lock of the loop's).
// Every member takes one mutex at most (NewEntry often none); no member blocks except WaitForWork,
// and Push/PushAll while a device operation of the same name, already launched, finishes: a
// trainer that orders its next step after a reduction on a stream (Handle::synchronize_stream)
// submits the name again while the reduction may still run on the device, which is no duplicate.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gradsync/status.h"
#include "runtime/name_table.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

class TensorQueue {
 public:
  TensorQueue() = default;
  TensorQueue(const TensorQueue&) = delete;
  TensorQueue& operator=(const TensorQueue&) = delete;
  ~TensorQueue();

  // A cleared entry (see TensorEntry::Clear) to fill and push.
  std::unique_ptr<TensorEntry> NewEntry();
  // Fails with InvalidArgument if the name is in flight and not yet launched, or with the Close()
  // status once closed; waits if the operation in flight under the name has been launched on a
  // device, until it completes. Sets the entry's name_hash. With `due`, a push that would wake the
  // waiter (see SetWakeAfter) leaves that to its caller and says so in *due: the caller then does
  // the waiter's work itself or calls Wake().
  Status Push(std::unique_ptr<TensorEntry> entry, bool* due = nullptr);
  // Pushes several entries atomically: all are accepted or none is. `due` as for Push.
  Status PushAll(std::vector<std::unique_ptr<TensorEntry>> entries, bool* due = nullptr);

  // Returns once entries are waiting, the queue is closed, a wake-up was requested, or `max_wait`
  // has passed. It looks between yields for the first `poll_for` of the wait (at most
  // `max_wait`), and sleeps for the rest. With entries waiting, it first lets a burst of pushes
  // finish: it yields while the number waiting still grows from one look to the next, for at most
  // `settle_for`.
  void WaitForWork(std::chrono::nanoseconds max_wait,
                   std::chrono::nanoseconds settle_for = std::chrono::nanoseconds(0),
                   std::chrono::nanoseconds poll_for = std::chrono::nanoseconds(0));
  // A waiter asleep in WaitForWork is woken by pushes only once at least `entries` wait (at least
  // 1), or by a push of anything but an allreduce or broadcast: a locked schedule needs its thread
  // only when a bucket can be full or the lock must be left, and a wake-up per tensor costs the
  // pushing thread a system call and both threads a core. The wait's own time limit and Wake are
  // unaffected.
  void SetWakeAfter(size_t entries);
  // Wakes a WaitForWork or PauseUntil early (used for shutdown requests).
  void Wake();
  // True when entries were pushed after the last Drain.
  bool HasPending() const;
  // Sleeps until `deadline`, the queue is closed, a wake-up is requested or EndPause() is called;
  // pushes do not end it. Returns at once when EndPause() was called since the last pause.
  void PauseUntil(std::chrono::steady_clock::time_point deadline);
  // Ends the current pause, or the next one if none runs now: a caller is about to block on a
  // result, so there is nothing more to gather.
  void EndPause();
  // Entries pushed since the last Drain, in push order. They stay owned by the queue, in flight.
  std::vector<TensorEntry*> Drain();
  // Takes the entries out of flight; call before completing their handles so that callers may
  // reuse the names at once. The entries stay valid, unchanged (but for `in_flight`), until
  // Recycle(). Entries not in flight are ignored.
  void Release(const std::vector<TensorEntry*>& entries);
  // Clears the entries released since the last call and returns them to the pool; their pointers
  // are invalid afterwards. Call once their handles are completed.
  void Recycle();
  // Every entry in flight, drained or not.
  std::vector<TensorEntry*> InFlight() const;
  // Later pushes fail with `reason`.
  void Close(Status reason);
  // Status the queue was closed with; OK while open.
  Status closed_status() const;

 private:
  // Whether the operation in flight under `entry`'s name is a launched device operation.
  bool HeldByLaunchedLocked(const TensorEntry& entry) const;
  // Waits, releasing `lock` meanwhile, until no launched device operation holds `entry`'s name;
  // on gradsync's own threads, which that would deadlock, fails instead.
  Status WaitOutLaunchedLocked(std::unique_lock<std::mutex>* lock, const TensorEntry& entry);
  // The burst-settling part of WaitForWork; `lock` holds mu_.
  void SettleLocked(std::unique_lock<std::mutex>* lock, std::chrono::nanoseconds settle_for);
  // Moves a pooled entry into spare_ if it is empty, so that the next NewEntry takes no lock.
  void RefillSpareLocked();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable released_cv_;  // Release() wakes pushes waiting out a launched name
  int waiting_out_launched_ = 0;
  std::vector<TensorEntry*> pending_;
  // Keyed by the entry's own name, which stays unchanged while the entry is in flight.
  NameTable<std::unique_ptr<TensorEntry>> in_flight_;
  std::vector<std::unique_ptr<TensorEntry>> pool_;
  // One pooled entry set aside by Push: NewEntry takes it with an exchange instead of the lock,
  // so an enqueue locks once. Owned by the queue while set.
  std::atomic<TensorEntry*> spare_{nullptr};
  std::vector<std::unique_ptr<TensorEntry>> released_;  // until Recycle; background thread only
  Status closed_;
  bool closed_flag_ = false;
  bool wake_requested_ = false;
  bool waiter_sleeping_ = false;
  size_t wake_after_ = 1;
  bool pausing_ = false;      // a PauseUntil is waiting
  bool pause_ended_ = false;  // by EndPause, until a PauseUntil consumes it
};

}  // namespace gradsync
