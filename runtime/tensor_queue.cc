#include "runtime/tensor_queue.h"

#include <algorithm>
#include <unordered_set>

#include <optional>
#include <thread>
#include <utility>

#include "runtime/cpu_relax.h"
#include "runtime/thread_role.h"
#include "runtime/yield_until.h"

namespace gradsync {

namespace {

// What a locked plan never holds (joins, process-set changes, barriers, gathers): pushing one
// wakes the waiter whatever SetWakeAfter says, so that a lock it ends is left at once and this
// rank names it as the reason.
bool WakesAlways(OpType op) { return op != OpType::kAllreduce && op != OpType::kBroadcast; }

Status DuplicateName(const std::string& name) {
  return Status::InvalidArgument("tensor name '" + name +
                                 "' is already in flight; names must be unique until the "
                                 "operation completes");
}

// A completion callback runs on gradsync's own threads (or a caller's launching a locked bucket),
// holding what completing the launched operation needs: waiting for it there would never end.
Status StillOnTheDevice(const std::string& name) {
  return Status::InvalidArgument(
      "tensor name '" + name +
      "' is still in flight on the device, and a completion callback (run on gradsync's own "
      "thread) cannot wait for it to complete: enqueue it again from your own thread");
}

// A caller pushing a step's tensors and the thread completing its buckets take the queue's mutex
// within microseconds of each other at every bucket, and each holds it for about a microsecond.
// Blocking cost the pusher a sleep and a wake-up each time: over a no-op device backend a locked
// 64-tensor step, whose callers launch buckets while the finalizer completes earlier ones, took
// about twice as long as with the spin (docs/benchmarks.md).
constexpr std::chrono::microseconds kQueueLockSpin(10);

std::unique_lock<std::mutex> LockQueue(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  LockSpinningFirst(&lock, kQueueLockSpin);
  return lock;
}

}  // namespace

TensorQueue::~TensorQueue() { delete spare_.exchange(nullptr); }

std::unique_ptr<TensorEntry> TensorQueue::NewEntry() {
  if (TensorEntry* spare = spare_.exchange(nullptr, std::memory_order_acquire)) {
    return std::unique_ptr<TensorEntry>(spare);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pool_.empty()) {
      std::unique_ptr<TensorEntry> entry = std::move(pool_.back());
      pool_.pop_back();
      return entry;
    }
  }
  return std::make_unique<TensorEntry>();
}

// Only a device operation: a host one is launched and finished on the host, and submitting its name
// again before waiting for it is a caller's mistake, reported as a duplicate.
bool TensorQueue::HeldByLaunchedLocked(const TensorEntry& entry) const {
  const std::unique_ptr<TensorEntry>* held = in_flight_.Find(entry.key());
  return held != nullptr && (*held)->state != nullptr && (*held)->state->launched();
}

Status TensorQueue::WaitOutLaunchedLocked(std::unique_lock<std::mutex>* lock,
                                          const TensorEntry& entry) {
  if (closed_flag_ || !HeldByLaunchedLocked(entry)) return Status::OK();
  if (OnBackgroundThread()) return StillOnTheDevice(entry.name);
  ++waiting_out_launched_;
  released_cv_.wait(*lock, [&] { return closed_flag_ || !HeldByLaunchedLocked(entry); });
  --waiting_out_launched_;
  return Status::OK();
}

// Notifies only a sleeping waiter: on the hot enqueue path the background thread is usually busy
// or about to drain anyway, and a futex wake per tensor would be wasted. Clearing the flag keeps
// a burst of pushes to one wake-up: the waiter sets it again before each wait, so a push drained
// by a caller's cycle before the waiter looked leaves the next push to wake it.
Status TensorQueue::Push(std::unique_ptr<TensorEntry> entry, bool* due) {
  if (!entry) return Status::InvalidArgument("TensorQueue::Push: null entry");
  entry->name_hash = HashName(entry->name);  // outside the lock
  bool notify = false;
  {
    std::unique_lock<std::mutex> lock = LockQueue(mu_);
    if (closed_flag_) return closed_;
    TensorEntry* raw = entry.get();
    // The insert is the duplicate check: the common path hashes once. A refused insert leaves
    // `entry` untouched (NameTable moves the value in only once it has found room).
    while (!in_flight_.Insert(raw->key(), std::move(entry))) {
      if (!HeldByLaunchedLocked(*raw)) return DuplicateName(raw->name);
      GRADSYNC_RETURN_IF_ERROR(WaitOutLaunchedLocked(&lock, *raw));
      if (closed_flag_) return closed_;
    }
    raw->in_flight = true;
    pending_.push_back(raw);
    const bool wakes = pending_.size() >= wake_after_ || WakesAlways(raw->op);
    if (due != nullptr) {
      *due = wakes;
    } else {
      notify = wakes && std::exchange(waiter_sleeping_, false);
    }
    RefillSpareLocked();
  }
  if (notify) cv_.notify_one();
  return Status::OK();
}

// Checks the whole batch before inserting anything, so a rejected batch leaves no name in flight.
Status TensorQueue::PushAll(std::vector<std::unique_ptr<TensorEntry>> entries, bool* due) {
  for (const auto& entry : entries) {
    if (!entry) return Status::InvalidArgument("TensorQueue::PushAll: null entry");
    entry->name_hash = HashName(entry->name);
  }
  bool notify = false;
  {
    std::unique_lock<std::mutex> lock = LockQueue(mu_);
    std::unordered_set<NameKey, NameKeyHash> batch;
    // Checked again from the start after waiting out a launched operation under one of the names.
    for (const TensorEntry* taken = nullptr;; taken = nullptr) {
      if (closed_flag_) return closed_;  // an empty batch must fail too once closed
      batch.clear();
      for (const auto& entry : entries) {
        if (in_flight_.Contains(entry->key())) {
          if (!HeldByLaunchedLocked(*entry)) return DuplicateName(entry->name);
          taken = entry.get();
          break;
        }
        if (!batch.insert(entry->key()).second) return DuplicateName(entry->name);
      }
      if (taken == nullptr) break;
      GRADSYNC_RETURN_IF_ERROR(WaitOutLaunchedLocked(&lock, *taken));
    }
    for (auto& entry : entries) {
      TensorEntry* raw = entry.get();
      in_flight_.Insert(raw->key(), std::move(entry));
      raw->in_flight = true;
      pending_.push_back(raw);
    }
    const bool wakes =
        pending_.size() >= wake_after_ ||
        std::any_of(pending_.end() - static_cast<std::ptrdiff_t>(entries.size()), pending_.end(),
                    [](const TensorEntry* e) { return WakesAlways(e->op); });
    if (due != nullptr) {
      *due = !entries.empty() && wakes;
    } else {
      notify = !entries.empty() && wakes && std::exchange(waiter_sleeping_, false);
    }
  }
  if (notify) cv_.notify_one();
  return Status::OK();
}

void TensorQueue::WaitForWork(std::chrono::nanoseconds max_wait,
                              std::chrono::nanoseconds settle_for,
                              std::chrono::nanoseconds poll_for) {
  std::unique_lock<std::mutex> lock(mu_);
  auto has_work = [this] { return !pending_.empty() || closed_flag_ || wake_requested_; };
  if (!has_work() && poll_for.count() > 0) {
    const auto start = std::chrono::steady_clock::now();
    YieldUntil(&lock, start + std::min(poll_for, max_wait), has_work);
    max_wait -= std::min(max_wait, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - start));
  }
  // The flag is set again before each wait: a caller's cycle (BackgroundLoop::RunCycleForCaller)
  // may drain the push that woke this thread before it looks, and a push that then found the flag
  // clear would not wake it again.
  if (!has_work()) {
    const auto deadline = std::chrono::steady_clock::now() + max_wait;
    do {
      waiter_sleeping_ = true;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
    } while (!has_work());
    waiter_sleeping_ = false;
  }
  wake_requested_ = false;
  SettleLocked(&lock, settle_for);
}

// A caller enqueueing a step's tensors pushes one every tenth of a microsecond or so, and the
// first push wakes this thread. A cycle started at once would negotiate and reduce only the first
// few, then run again for the rest: on a rank whose caller and background thread share a core,
// that second cycle cost a 1000-tensor step about a third more. Yielding between looks lets the
// caller finish (on a shared core, it runs until it blocks); gradients that arrive spread out, as
// a backward pass makes them, see no growth between two looks and start the cycle at once.
void TensorQueue::SettleLocked(std::unique_lock<std::mutex>* lock,
                               std::chrono::nanoseconds settle_for) {
  if (settle_for.count() <= 0 || pending_.empty()) return;
  const auto deadline = std::chrono::steady_clock::now() + settle_for;
  for (size_t seen = pending_.size(); !closed_flag_ && !wake_requested_;) {
    lock->unlock();
    std::this_thread::yield();
    lock->lock();
    if (pending_.size() == seen || std::chrono::steady_clock::now() >= deadline) return;
    seen = pending_.size();
  }
}

void TensorQueue::SetWakeAfter(size_t entries) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_after_ = std::max<size_t>(entries, 1);
}

// The request is remembered when nobody sleeps, so the next WaitForWork returns at once.
void TensorQueue::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_requested_ = true;
  }
  cv_.notify_all();
}

bool TensorQueue::HasPending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !pending_.empty();
}

void TensorQueue::PauseUntil(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  pausing_ = true;
  cv_.wait_until(lock, deadline,
                 [this] { return closed_flag_ || wake_requested_ || pause_ended_; });
  pausing_ = false;
  pause_ended_ = false;
}

// Notifies only a pause in progress: a waiter asleep in WaitForWork has nothing to do with it, and
// callers block once per step or more.
void TensorQueue::EndPause() {
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pause_ended_ = true;
    notify = pausing_;
  }
  if (notify) cv_.notify_all();
}

std::vector<TensorEntry*> TensorQueue::Drain() {
  std::vector<TensorEntry*> drained;
  std::lock_guard<std::mutex> lock(mu_);
  drained.swap(pending_);
  // The next burst is likely as large as this one: one allocation instead of regrowing.
  pending_.reserve(drained.size());
  return drained;
}

// A step's tensors usually complete together, leaving nothing else in flight: then the whole table
// is emptied at once instead of erasing name by name. The flags make that safe whatever is passed:
// only when every entry in flight is among `entries` do the counts agree.
void TensorQueue::Release(const std::vector<TensorEntry*>& entries) {
  std::unique_lock<std::mutex> lock = LockQueue(mu_);
  if (waiting_out_launched_ > 0) released_cv_.notify_all();
  size_t releasing = 0;
  for (TensorEntry* entry : entries) {
    if (entry->in_flight) {
      entry->in_flight = false;
      ++releasing;
    }
  }
  if (releasing == 0) return;
  if (releasing == in_flight_.size()) {
    in_flight_.TakeAll(&released_);
    return;
  }
  for (const TensorEntry* entry : entries) {
    // Only the entry itself: another entry may be in flight under the same name.
    const std::unique_ptr<TensorEntry>* held = in_flight_.Find(entry->key());
    if (held == nullptr || held->get() != entry) continue;
    released_.push_back(std::move(*in_flight_.Take(entry->key())));
  }
}

void TensorQueue::RefillSpareLocked() {
  if (pool_.empty() || spare_.load(std::memory_order_relaxed) != nullptr) return;
  spare_.store(pool_.back().release(), std::memory_order_release);
  pool_.pop_back();
}

// Entries are cleared outside the lock: clearing runs the destructors of whatever a caller's
// allocator captured, which must not run under a lock that enqueueing threads take.
void TensorQueue::Recycle() {
  if (released_.empty()) return;
  for (auto& entry : released_) entry->Clear();
  std::unique_lock<std::mutex> lock = LockQueue(mu_);
  for (auto& entry : released_) pool_.push_back(std::move(entry));
  released_.clear();
}

std::vector<TensorEntry*> TensorQueue::InFlight() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TensorEntry*> all;
  all.reserve(in_flight_.size());
  for (const auto& [name, entry] : in_flight_) all.push_back(entry.get());
  return all;
}

// The first reason wins: it is the root cause (say a stall), later ones are consequences. An OK
// reason would let failed pushes look successful, so it becomes a plain shutdown error.
void TensorQueue::Close(Status reason) {
  if (reason.ok()) reason = Status::Shutdown("gradsync has been shut down");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_flag_) {
      closed_ = std::move(reason);
      closed_flag_ = true;
    }
  }
  cv_.notify_all();
  released_cv_.notify_all();
}

Status TensorQueue::closed_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace gradsync
