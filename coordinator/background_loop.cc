#include "coordinator/background_loop.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <thread>

#ifdef __linux__
#include <pthread.h>
#endif

#include "ops/device/device_events.h"
#include "ops/device/producer_readiness.h"
#include "runtime/logging.h"
#include "runtime/thread_role.h"
#include "runtime/timeline_activity.h"

namespace gradsync {

namespace {

constexpr std::chrono::nanoseconds kFirstBackoff = std::chrono::microseconds(20);
constexpr std::chrono::nanoseconds kLongestLockPoll = std::chrono::microseconds(200);
// After this many cycles without progress (1.3 ms of backing off), negotiation waits for late peers
// asleep (ControlChannel::SetPatient). A rank waiting on a stalled peer, or idle between steps,
// otherwise polled through most of each cycle's exchange: under a sanitizer, a fifth of a core.
constexpr int kPatientAfterCycles = 6;
// An idle rank's rounds, which keep a peer that waits on it (a stall, a join) answered, go from a
// cycle time apart to a sixteenth of how long the rank has been idle, up to this: a rank idle for
// a validation pass does a round every 20 ms instead of every millisecond. A push still wakes the
// thread at once, so only a peer's wait on a tensor this rank never submits sees the spacing.
constexpr std::chrono::nanoseconds kLongestIdleWait = std::chrono::milliseconds(20);

}  // namespace

BackgroundLoop::BackgroundLoop(const Config& config, const MpiContext& mpi, TensorQueue* queue,
                               Timeline* timeline, ProcessSetRegistry* registry,
                               CallerLaneTable* lanes)
    : config_(config),
      mpi_(mpi),
      queue_(queue),
      timeline_(timeline),
      sets_(mpi, config, timeline, registry),
      lanes_(config, lanes),
      finalizer_([this](const std::vector<TensorEntry*>& entries,
                        const Status& status) { Complete(entries, status); },
                 timeline) {
  finalizer_.set_slow_warning(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(config.stall_warning_seconds)));
}

BackgroundLoop::~BackgroundLoop() {
  if (thread_.joinable()) Shutdown();
}

Status BackgroundLoop::AddProcessSet(const std::vector<int>& ranks, int32_t* id) {
  return sets_.Add(ranks, id);
}

void BackgroundLoop::Start(std::function<void()> on_thread_start) {
  running_ = true;
  thread_ = std::thread([this, on_thread_start = std::move(on_thread_start)] {
#ifdef __linux__
    pthread_setname_np(pthread_self(), "gradsync-loop");  // as top -H and /proc show it
#endif
    if (on_thread_start) on_thread_start();
    Run();
  });
}

void BackgroundLoop::Shutdown() {
  shutdown_requested_ = true;
  queue_->Wake();
  if (thread_.joinable()) thread_.join();
}

void BackgroundLoop::Run() {
  MarkBackgroundThread();
  while (RunOneCycle()) {
    cycles_run_.fetch_add(1, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lock(cycle_mu_);
  all_locked_ = false;
  caller_cycles_ = false;
  running_ = false;
}

void BackgroundLoop::WaitForFreshCycle() {
  // The cycle under way may have begun before the call: the one after it is whole.
  const uint64_t target = cycles_run_.load(std::memory_order_acquire) + 2;
  while (running_.load() && cycles_run_.load(std::memory_order_acquire) < target) {
    queue_->Wake();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::chrono::nanoseconds BackgroundLoop::NextWait() const {
  const auto cycle_time = CycleTime();
  if (held_ == 0) {  // idle: a push wakes us early
    const auto idle_for = std::chrono::steady_clock::now() - idle_since_;
    return std::max<std::chrono::nanoseconds>(cycle_time,
                                              std::min(idle_for / 16, kLongestIdleWait));
  }
  // Work is waiting on other ranks. Go again at once while cycles make progress (the control
  // collective itself is the rendezvous), and back off towards the cycle time while they do not,
  // so a rank waiting on a stalled peer sleeps.
  if (unproductive_cycles_ == 0) return std::chrono::nanoseconds(0);
  const auto backoff = kFirstBackoff * (1 << std::min(unproductive_cycles_ - 1, 16));
  // A locked bucket's exchange completes without waking anyone: test it as often as a
  // negotiation round is tested.
  if (lock_exchanging_) return std::min<std::chrono::nanoseconds>(backoff, kLongestLockPoll);
  return std::min<std::chrono::nanoseconds>(backoff, cycle_time);
}

bool BackgroundLoop::RunOneCycle() {
  std::chrono::nanoseconds wait, settle, poll;
  {
    std::lock_guard<std::mutex> lock(cycle_mu_);
    wait = NextWait();
    // Locked, a burst is not waited out: the bucket it fills starts at once.
    settle = wake_after_ > 0 ? std::chrono::nanoseconds(0) : CycleTime();
    // Callers launch locked buckets themselves: this thread has nothing to look out for.
    poll = RunsCallerCycles() ? std::chrono::nanoseconds(0) : PollWindow();
  }
  queue_->WaitForWork(wait, settle, poll);
  std::chrono::steady_clock::time_point pause_until;
  {
    std::unique_lock<std::mutex> lock = LockCycle();
    if (stop_) return false;
    if (!RunCycle(/*on_caller=*/false, &pause_until)) return false;
  }
  if (pause_until != std::chrono::steady_clock::time_point()) queue_->PauseUntil(pause_until);
  return true;
}

std::unique_lock<std::mutex> BackgroundLoop::LockCycle() {
  std::unique_lock<std::mutex> lock(cycle_mu_, std::try_to_lock);
  for (int looks = 0; !lock.owns_lock() && looks < 1000; ++looks) {
    std::this_thread::yield();
    lock.try_lock();
  }
  if (!lock.owns_lock()) lock.lock();
  return lock;
}

void BackgroundLoop::RunCycleForCaller() {
  bool wake = true;
  {
    std::unique_lock<std::mutex> lock(cycle_mu_, std::try_to_lock);
    if (lock.owns_lock() && RunsCallerCycles() && !stop_) {
      CallerDeviceScope keep_callers_device;
      BackgroundWorkScope callbacks_may_not_block;
      std::chrono::steady_clock::time_point unused;
      // Not counted in cycles_run_: a caller's cycle runs locked buckets only and negotiates
      // nothing, so WaitForFreshCycle must not take it for a round.
      stop_ = !RunCycle(/*on_caller=*/true, &unused);
      // Not when only the next bucket is the loop's and not yet full: the push that fills it
      // wakes the loop.
      const LockedSchedule* locked = LockedSet();
      wake = stop_ || !DefersReadiness() || lock_exchanging_ ||
             (locked != nullptr && locked->MissingForNextBucket() == 0);
    }
  }
  // The loop's thread is in a cycle (it drains this push next), or it has work now.
  if (wake) queue_->Wake();
}

bool BackgroundLoop::AllSetsLocked() {
  ProcessSetRuntime* set = sets_.Next(-1);
  for (; set != nullptr; set = sets_.Next(set->id())) {
    if (!set->lock().locked()) return false;
  }
  return true;
}

bool BackgroundLoop::RunCycle(bool on_caller, std::chrono::steady_clock::time_point* pause_until) {
  const auto started = std::chrono::steady_clock::now();
  Distribute(TakeFreshEntries());
  if (!on_caller) lanes_.Watch();
  bool productive = false;
  lock_exchanging_ = false;
  const bool patient = unproductive_cycles_ >= kPatientAfterCycles;
  // By id, so that sets added or removed by the global set's responses are picked up (or skipped)
  // in this same cycle on every rank alike.
  for (ProcessSetRuntime* set = sets_.Next(-1); set != nullptr;) {
    const int32_t id = set->id();
    set->SetPatient(patient);
    if (!RunSetCycle(set, on_caller, &productive)) {
      all_locked_ = false;
      caller_cycles_ = false;
      return false;
    }
    set = sets_.Next(id);
  }
  unproductive_cycles_ = productive ? 0 : std::min(unproductive_cycles_ + 1, 64);
  if (held_ > 0) {
    idle_since_ = std::chrono::steady_clock::time_point::max();
  } else if (idle_since_ == std::chrono::steady_clock::time_point::max()) {
    idle_since_ = started;
  }
  // Tensors pushed while this cycle ran mean the caller is streaming them (a backward pass's hooks)
  // rather than waiting on results: the next cycle then starts one cycle time after this one, so
  // that what arrives meanwhile shares one negotiation instead of each paying a wake-up and a
  // control round. A caller that waits on each result pushes nothing during the cycle and keeps
  // the quick start.
  // A locked set has no negotiation to share: its buckets start as soon as they fill, and its
  // thread is woken by the push that can fill the next one.
  const LockedSchedule* locked = LockedSet();
  wake_after_ = locked != nullptr ? std::max<size_t>(locked->MissingForNextBucket(), 1) : 0;
  queue_->SetWakeAfter(wake_after_);
  all_locked_ = locked != nullptr && AllSetsLocked();
  // A bucket of several tensors costs its launcher two batched copies, which `single` keeps off
  // the caller's thread; one of a single tensor costs it the collective (and a scale kernel where
  // it averages or scales).
  const bool callers_bucket = config_.caller_launch == CallerLaunch::kAll ||
                              (config_.caller_launch == CallerLaunch::kSingle &&
                               locked != nullptr && locked->NextBucketSize() == 1);
  caller_cycles_ = all_locked_ && callers_bucket;
  if (!on_caller && queue_->HasPending() && wake_after_ == 0) {
    *pause_until = started + CycleTime();
  }
  return true;
}

bool BackgroundLoop::RunSetCycle(ProcessSetRuntime* set, bool on_caller, bool* productive) {
  const int32_t id = set->id();
  if (set->lock().locked()) {
    if (!RunLockedCycle(set, on_caller, productive)) return false;
    if (sets_.Find(id) == nullptr || set->lock().locked()) return true;  // closed, or still locked
    // It left the lock in this cycle: what it held is in fresh(), negotiated now (by the loop's
    // own thread: a negotiation round is no work for a caller's).
  }
  if (on_caller) return true;
  const bool global = id == 0;
  CycleOutcome outcome;
  // Only a rank that runs no other set may lock: a locked set's buckets start once the exchange
  // completes, which each rank sees in a cycle of its own, so a rank could sit in one of them
  // while another waits for it in a different set's negotiation round.
  const bool want_lock = set->lock().WantsToLock() && sets_.RunsOnlyGlobal() && !set->tuning();
  const Status negotiated = set->negotiator().RunCycle(
      set->fresh(), global && shutdown_requested_.load(), &outcome, want_lock);
  set->fresh().clear();
  if (!negotiated.ok()) {
    Log().error("negotiation in process set {} failed: {}", id, negotiated.ToString());
    return FailSet(set, negotiated, outcome.entries);  // some may have left the negotiator already
  }
  if (timeline_->active()) MarkNegotiated(outcome);
  if (!outcome.responses.empty()) *productive = true;
  // Before the entries run: a completed entry goes back to the pool, cleared.
  set->lock().Observe(outcome);
  const Status executed = Execute(set, outcome);
  if (!executed.ok()) {
    // A stall has run everything before it; an Internal error has completed nothing.
    const bool stalled = executed.code() == StatusCode::kStalled;
    return FailSet(set, executed, stalled ? std::vector<TensorEntry*>() : outcome.entries);
  }
  if (outcome.shutdown) {
    FailEverything(Status::Shutdown(
        std::string("gradsync was shut down before this operation completed (shutdown() was "
                    "called on ") +
        (shutdown_requested_.load() ? "this rank)" : "another rank)")));
    return false;
  }
  if (outcome.lock_agreed && set->lock().ready()) {
    const Status locked = set->lock().Lock(set->fusion(), [set](const std::string& name) {
      return set->negotiator().CachedResponse(name);
    });
    if (!locked.ok()) return FailSet(set, locked, {});
    if (set->lock().locked()) {
      // What waited in the cache for the next step is the lock's now.
      set->fresh() = set->negotiator().TakeAllPending();
      if (timeline_->active()) {
        timeline_->Mark("LOCK set " + std::to_string(id) + ": " +
                        std::to_string(set->lock().planned_buckets()) + " buckets");
      }
    }
  }
  return true;
}

bool BackgroundLoop::RunLockedCycle(ProcessSetRuntime* set, bool on_caller, bool* productive) {
  const bool global = set->id() == 0;
  LockedCycle cycle;
  // Under GRADSYNC_CALLER_LAUNCH=single a caller's cycle stops before a fused bucket, which
  // RunCycleForCaller then wakes the loop's thread to run.
  const size_t most_tensors =
      on_caller && config_.caller_launch == CallerLaunch::kSingle ? 1 : SIZE_MAX;
  const Status ran = set->lock().RunCycle(set->fresh(), global && shutdown_requested_.load(),
                                          "shutdown() was called on this rank", &cycle,
                                          /*poll_peers=*/!on_caller, most_tensors);
  set->fresh().clear();
  if (!ran.ok()) {
    Log().error("locked schedule of process set {} failed: {}", set->id(), ran.ToString());
    return FailSet(set, ran, EntriesOf(cycle.buckets, 0));
  }
  for (size_t i = 0; i < cycle.buckets.size(); ++i) {
    *productive = true;
    if (timeline_->active()) MarkNegotiated(cycle.buckets[i]);
    const Status executed = Execute(set, cycle.buckets[i]);
    if (!executed.ok()) return FailSet(set, executed, EntriesOf(cycle.buckets, i));
  }
  if (cycle.unlocked) {
    // RunSetCycle negotiates what the lock held in this same cycle.
    if (timeline_->active()) {
      timeline_->Mark("UNLOCK set " + std::to_string(set->id()) + ": " + cycle.reason);
    }
    set->fresh() = std::move(cycle.returned);
  }
  lock_exchanging_ |= set->lock().exchanging();
  return true;
}

std::vector<TensorEntry*> BackgroundLoop::EntriesOf(const std::vector<CycleOutcome>& buckets,
                                                    size_t from) {
  std::vector<TensorEntry*> entries;
  for (size_t i = from; i < buckets.size(); ++i) {
    entries.insert(entries.end(), buckets[i].entries.begin(), buckets[i].entries.end());
  }
  return entries;
}

bool BackgroundLoop::FailSet(ProcessSetRuntime* set, const Status& why,
                             const std::vector<TensorEntry*>& taken) {
  if (set->id() == 0) {
    FailEverything(why);
    return false;
  }
  CloseSet(set->id(), why, taken);
  return true;
}

const LockedSchedule* BackgroundLoop::LockedSet() {
  for (ProcessSetRuntime* set = sets_.Next(-1); set != nullptr; set = sets_.Next(set->id())) {
    if (set->lock().locked()) return &set->lock();
  }
  return nullptr;
}

std::vector<TensorEntry*> BackgroundLoop::TakeFreshEntries() {
  std::vector<TensorEntry*> entries = queue_->Drain();
  // A cycle that only looks again at what it holds marks the timeline only while cycles get work
  // done: one that waits for a stalled or joined peer runs about every millisecond, for as long.
  const bool marked = !entries.empty() || (held_ > 0 && unproductive_cycles_ == 0);
  if (marked && timeline_->active()) {
    timeline_->CycleMark();
    for (const TensorEntry* entry : entries) {
      timeline_->ActivityEnd(entry->name);  // the QUEUE activity the enqueue started
      std::string label = OpTypeName(entry->op);
      for (char& c : label) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      ProcessSetRuntime* set = sets_.Find(entry->process_set);
      if (set != nullptr && set->lock().locked()) {
        timeline_->ActivityStart(entry->name, "LOCKED_" + label);  // waits for its bucket
      } else {
        timeline_->NegotiateStart(entry->name, label);  // NEGOTIATE_ALLREDUCE, ...
      }
    }
  }
  held_ += entries.size();
  return entries;
}

void BackgroundLoop::Distribute(const std::vector<TensorEntry*>& entries) {
  // Entries a locked enqueue left unrecorded. A locked set's are recorded by the launch of their
  // bucket, one event per producer stream for the whole bucket however many cycles took it
  // (DevicePlane::WaitForInputs); the others' now, one event per stream for all of them, since
  // negotiation may take them much later, when their producer's stream may be gone.
  unrecorded_.clear();
  for (TensorEntry* entry : entries) {
    if (entry->ready_stream == nullptr) continue;
    ProcessSetRuntime* set = sets_.Find(entry->process_set);
    if (set == nullptr || !set->lock().locked()) unrecorded_.push_back(entry);
  }
  const Status recorded = RecordProducerReadiness(unrecorded_);
  for (TensorEntry* entry : entries) {
    ProcessSetRuntime* set = sets_.Find(entry->process_set);
    if (set != nullptr && (entry->ready_stream == nullptr || set->lock().locked())) {
      set->fresh().push_back(entry);
      continue;
    }
    // The set was removed or failed after this entry was enqueued, or the entry's readiness
    // could not be recorded.
    const Status why =
        set == nullptr
            ? sets_.Unavailable(entry->process_set)
            : Status(recorded.code(), "recording the producer's readiness: " + recorded.message());
    Complete({entry}, Status(why.code(), OpTypeName(entry->op) + " of tensor '" + entry->name +
                                             "' on rank " + std::to_string(mpi_.rank()) + ": " +
                                             why.message()));
  }
}

void BackgroundLoop::MarkNegotiated(const CycleOutcome& outcome) {
  for (size_t i = 0; i < outcome.responses.size(); ++i) {
    if (outcome.entries[i] != nullptr) timeline_->NegotiateEnd(outcome.entries[i]->name);
  }
}

void BackgroundLoop::Complete(const std::vector<TensorEntry*>& members, const Status& status) {
  // Names are released first so a caller woken by its handle may reuse the name at once; the
  // entries (and their states) go back to the pool only once completed.
  std::lock_guard<std::mutex> lock(completion_mu_);
  releasing_.clear();
  for (TensorEntry* entry : members) {
    if (entry->state == nullptr) continue;  // a stand-in: not the queue's, no handle
    releasing_.push_back(entry);
  }
  queue_->Release(releasing_);
  held_ -= releasing_.size();
  for (TensorEntry* entry : releasing_) entry->state->RunCallback(status);
  for (TensorEntry* entry : releasing_) entry->state->Record(status);
  OpState::AnnounceCompletions();
  queue_->Recycle();
}

void BackgroundLoop::CloseSet(int32_t id, const Status& reason,
                              const std::vector<TensorEntry*>& taken) {
  finalizer_.Drain();
  std::vector<TensorEntry*> orphaned;
  for (TensorEntry* entry : taken) {
    if (entry != nullptr) orphaned.push_back(entry);
  }
  sets_.Close(id, reason, &orphaned);
  Complete(orphaned, reason);
}

void BackgroundLoop::FailEverything(const Status& reason) {
  queue_->Close(reason);
  finalizer_.Drain();  // launched device work completes on its own (or by its timeout)
  TakeFreshEntries();
  Complete(queue_->InFlight(), reason);
}

}  // namespace gradsync
