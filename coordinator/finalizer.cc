#include "coordinator/finalizer.h"

#include <algorithm>
#include <cstdio>

#include "ops/device/device_events.h"
#include "runtime/logging.h"
#include "runtime/thread_role.h"

namespace gradsync {

namespace {

// For at least this long after a bucket arrives or completes, the finalizer looks again after a
// yield instead of a sleep: a small reduction on a GPU completes within microseconds of its
// launch, and waking from even a short sleep costs about as much. It keeps looking through the
// window with nothing in flight too: a caller that waits on each operation adds the next one
// microseconds after the last completed, and waking the finalizer from its condition variable for
// it cost more than the rest of the operation's host path together (over a no-op device backend
// at 1 rank, 17 us an operation against 1.8 us).
constexpr std::chrono::microseconds kSpinWindow(100);
// And longer when the buckets have been arriving further apart (SpinWindow), up to this: a
// host-bound backward launches its buckets a few hundred microseconds apart, and each that found
// the finalizer asleep cost its launching caller a wake-up. A gap longer than half of this is
// slept through. Not for buckets whose events tell of their completion: a host thread runs those
// (the MPI backend's stream), and a finalizer spinning through the gaps kept the core that thread
// needs looking busy, so the scheduler queued the thread behind a busy one instead (over the host
// device backend at 1 rank of a 2-core VM, the locked step's 190-226 us over raw went to 189-389).
constexpr std::chrono::microseconds kLongestSpinWindow(1000);
// Past kSpinWindow, a yield that returns this late gave the core to a thread that had work for
// it (ranks sharing cores, a data loader): the finalizer then sleeps instead of taking the core
// back at every turn. At 2 ranks on a 2-core VM, spinning on through the window made most
// negotiated operations over the no-op backend take about 70 us instead of about 40.
constexpr std::chrono::microseconds kCoreWanted(50);
// Then it sleeps between looks while nothing completes, from a few microseconds (a small
// reduction's latency) up to a millisecond (what a step's last reduction may wait at most).
constexpr std::chrono::microseconds kFirstPause(5);
constexpr std::chrono::microseconds kLongestPause(1000);
// How often asynchronous errors are polled while work is in flight.
constexpr std::chrono::milliseconds kErrorPollInterval(10);
std::string Seconds(std::chrono::nanoseconds d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g s", std::chrono::duration<double>(d).count());
  return text;
}

}  // namespace

// Shared with the events that tell of their completion, so that one may wake the finalizer after
// it has seen the completion itself and moved on, or been destroyed.
class Finalizer::Wakeup : public CompletionListener {
 public:
  void EventCompleted() override { Wake(); }

  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken_ = true;
      if (!sleeping_) return;  // it looks at everything before it sleeps again
      ++sleepers_woken_;
    }
    cv_.notify_one();
  }

  size_t sleepers_woken() {
    std::lock_guard<std::mutex> lock(mu_);
    return sleepers_woken_;
  }

  // Until woken or `until`. A wake-up that came since the last sleep ends this one at once.
  void Sleep(std::chrono::steady_clock::time_point until) {
    std::unique_lock<std::mutex> lock(mu_);
    sleeping_ = true;
    const auto woken = [this] { return woken_; };
    if (until == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock, woken);
    } else {
      cv_.wait_until(lock, until, woken);
    }
    sleeping_ = false;
    woken_ = false;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false;
  size_t sleepers_woken_ = 0;
  bool sleeping_ = false;
};

Finalizer::Finalizer(CompleteFn complete, Timeline* timeline)
    : Finalizer(std::move(complete), timeline,
                SpinWindow(kSpinWindow, kLongestSpinWindow, kCoreWanted)) {}

Finalizer::Finalizer(CompleteFn complete, Timeline* timeline, const SpinWindow& spin)
    : complete_(std::move(complete)),
      timeline_(timeline),
      wakeup_(std::make_shared<Wakeup>()),
      spin_(spin) {}

Finalizer::~Finalizer() {
  Drain();
  stopping_.store(true);
  wakeup_->Wake();
  if (thread_.joinable()) thread_.join();
}

Finalizer::Bucket Finalizer::NewBucket(DataPlane* plane, int32_t process_set,
                                       const std::vector<TensorEntry*>& entries,
                                       std::shared_ptr<StreamEvent> done) {
  const auto timeout = plane->completion_timeout();
  const auto now = std::chrono::steady_clock::now();
  Bucket bucket;
  bucket.plane = plane;
  bucket.process_set = process_set;
  bucket.entries = entries;
  bucket.done = std::move(done);
  bucket.deadline = timeout >= std::chrono::steady_clock::time_point::max() - now
                        ? std::chrono::steady_clock::time_point::max()
                        : now + timeout;
  bucket.added = now;
  bucket.next_warning = std::chrono::steady_clock::time_point::max();
  bucket.pacer = QueryPacer(now);
  return bucket;
}

void Finalizer::Add(DataPlane* plane, int32_t process_set, const std::vector<TensorEntry*>& entries,
                    std::shared_ptr<StreamEvent> done, std::vector<DataPlane::TimedPhase> phases,
                    std::chrono::steady_clock::time_point launched) {
  Bucket bucket = NewBucket(plane, process_set, entries, std::move(done));
  bucket.phases = std::move(phases);
  bucket.launched = launched;
  Push(std::move(bucket));
}

void Finalizer::AddLocalFailures(DataPlane* plane, int32_t process_set,
                                 const std::vector<LocalFailure>& failures,
                                 const std::shared_ptr<StreamEvent>& done) {
  for (const LocalFailure& failure : failures) {
    Bucket bucket = NewBucket(plane, process_set, {failure.entry}, done);
    bucket.failed_here = failure.status;
    Push(std::move(bucket));
  }
}

void Finalizer::Push(Bucket bucket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(bucket));
    inbox_filled_.store(true, std::memory_order_release);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }
  wakeup_->Wake();
}

void Finalizer::TracePhases(const Bucket& bucket) {
  if (timeline_ == nullptr || !timeline_->active()) return;
  std::chrono::steady_clock::time_point begin = bucket.launched;
  for (const DataPlane::TimedPhase& phase : bucket.phases) {
    std::chrono::steady_clock::time_point end;
    if (!phase.end->CompletedAt(&end)) return;
    for (const TensorEntry* entry : bucket.entries) {
      if (entry->state != nullptr) timeline_->ActivitySpan(entry->name, phase.label, begin, end);
    }
    begin = std::max(begin, end);
  }
}

void Finalizer::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  drained_.wait(lock, [this] { return inbox_.empty() && adopted_ == 0; });
}

size_t Finalizer::sleeping_wakeups() const { return wakeup_->sleepers_woken(); }

size_t Finalizer::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inbox_.size() + adopted_;
}

void Finalizer::Run() {
  // Completion callbacks run here as on the background thread, with the same limits.
  MarkBackgroundThread();
  auto pause = kFirstPause;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    const auto idle = now - active_at_;
    // A contending event due soon is waited for between yields too: a sleep would overshoot it.
    const bool recent = spin_.Spins(idle) || next_contended_query_ < now + kSpinWindow;
    const bool arrived = inbox_filled_.load(std::memory_order_acquire);
    if (recent && !arrived && owned_.empty()) {
      // Between operations: look again without the lock the next Add takes.
      if (stopping_.load(std::memory_order_relaxed)) return;
      std::this_thread::yield();
      spin_.Yielded(idle, std::chrono::steady_clock::now() - now);
      continue;
    }
    if (!recent && !arrived) {
      if (owned_.empty()) {
        wakeup_->Sleep(std::chrono::steady_clock::time_point::max());
        pause = kFirstPause;
      } else {
        // An event that tells of its completion wakes the finalizer: without one to poll, it
        // wakes by itself only for a contending event, a deadline, or the next error poll.
        auto until = now + (polled_ ? std::chrono::nanoseconds(pause)
                                    : std::chrono::nanoseconds(kErrorPollInterval));
        wakeup_->Sleep(std::min({until, next_contended_query_, next_deadline_}));
      }
      if (stopping_.load() && !inbox_filled_.load() && owned_.empty()) return;
    } else if (recent && !arrived) {
      std::this_thread::yield();  // work in flight: its event is looked at again below
    }
    const bool adopted = Adopt();
    if (Sweep() > 0 || adopted) {
      pause = kFirstPause;
      active_at_ = std::chrono::steady_clock::now();
    } else if (!recent) {
      pause = std::min(pause * 2, kLongestPause);
    }
  }
}

bool Finalizer::Adopt() {
  if (!inbox_filled_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  for (Bucket& bucket : inbox_) {
    const Status device = UseDeviceOfEvent(*bucket.done);
    if (!device.ok() && !device_warned_) {
      device_warned_ = true;
      Log().warn("the finalizer looks at device events without their device: {}",
                 device.ToString());
    }
    // An event tells its listener outside its own lock, and the wake-up never takes mu_.
    bucket.notifies = bucket.done->NotifyOnCompletion(wakeup_);
    spin_.Arrived(bucket.added, /*may_widen=*/!bucket.notifies);
    if (slow_warning_.count() > 0) bucket.next_warning = bucket.added + slow_warning_;
    owned_.push_back(std::move(bucket));
  }
  adopted_ += inbox_.size();
  const bool any = !inbox_.empty();
  inbox_.clear();
  inbox_filled_.store(false, std::memory_order_relaxed);
  return any;
}

size_t Finalizer::Sweep() {
  next_contended_query_ = std::chrono::steady_clock::time_point::max();
  next_deadline_ = std::chrono::steady_clock::time_point::max();
  polled_ = false;
  if (owned_.empty()) return 0;
  std::vector<Bucket> finished;
  std::vector<std::pair<DataPlane*, Status>> aborts;
  std::vector<DataPlane*> busy_planes;
  const auto now = std::chrono::steady_clock::now();
  const bool poll_errors = now - last_error_poll_ >= kErrorPollInterval;
  if (poll_errors) last_error_poll_ = now;
  // A plane's buckets complete in launch order: its stream runs them in that order, but an
  // earlier bucket's event may be seen unfinished just before a later one is seen finished.
  std::vector<const DataPlane*> behind;
  for (auto it = owned_.begin(); it != owned_.end();) {
    const bool earlier_pending = std::find(behind.begin(), behind.end(), it->plane) != behind.end();
    const bool contends = it->done->QueryContends();
    const bool due = !contends || it->pacer.Due(now);
    if (!earlier_pending && due && it->done->Query()) {
      finished.push_back(std::move(*it));
      it = owned_.erase(it);
      continue;
    }
    if (!earlier_pending && contends) {
      if (due) it->pacer.Looked(now);
      next_contended_query_ = std::min(next_contended_query_, it->pacer.next());
    }
    if (!earlier_pending) behind.push_back(it->plane);
    const bool aborting = std::any_of(aborts.begin(), aborts.end(),
                                      [&](const auto& abort) { return abort.first == it->plane; });
    if (now >= it->deadline && !aborting) {
      const auto timeout = it->plane->completion_timeout();
      aborts.emplace_back(
          it->plane,
          Status::Timeout(Describe(*it) + " did not complete within " + Seconds(timeout) +
                          " (GRADSYNC_NCCL_TIMEOUT_SECONDS); the process set's device plane "
                          "was aborted and its later device operations fail"));
      it->deadline = std::chrono::steady_clock::time_point::max();  // abort once
    } else if (poll_errors &&
               std::find(busy_planes.begin(), busy_planes.end(), it->plane) == busy_planes.end()) {
      busy_planes.push_back(it->plane);
    }
    if (now >= it->next_warning) {
      WarnOfSlowBucket(*it, now);
      it->next_warning = now + slow_warning_;
    }
    next_deadline_ = std::min({next_deadline_, it->deadline, it->next_warning});
    polled_ = polled_ || (!contends && !it->notifies);
    ++it;
  }
  for (DataPlane* plane : busy_planes) {
    const Status error = plane->CheckAsyncError();
    if (!error.ok()) aborts.emplace_back(plane, error);
  }
  for (auto& [plane, status] : aborts) {
    Log().error("{}", status.ToString());
    plane->Abort(status);
  }
  for (Bucket& bucket : finished) {
    const Status status = bucket.done->Wait(std::chrono::nanoseconds(0));
    if (status.ok() && !bucket.phases.empty()) TracePhases(bucket);
    complete_(bucket.entries, bucket.failed_here.ok() ? status : bucket.failed_here);
  }
  if (!finished.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      adopted_ -= finished.size();
    }
    drained_.notify_all();
  }
  return finished.size();
}

void Finalizer::WarnOfSlowBucket(const Bucket& bucket, std::chrono::steady_clock::time_point now) {
  const auto timeout = bucket.plane->completion_timeout();
  const bool bounded = timeout < std::chrono::hours(24 * 365);
  Log().warn(
      "{} has not completed on the device {} after it was launched "
      "(GRADSYNC_STALL_WARNING_SECONDS); {}",
      Describe(bucket), Seconds(now - bucket.added),
      bounded ? "it fails after " + Seconds(timeout) + " (GRADSYNC_NCCL_TIMEOUT_SECONDS)"
              : std::string("GRADSYNC_NCCL_TIMEOUT_SECONDS is off, so it waits for good"));
  slow_warnings_.fetch_add(1, std::memory_order_relaxed);
}

std::string Finalizer::Describe(const Bucket& bucket) {
  // Stand-ins (no state) are the background thread's to reuse: only the named entries are read.
  std::vector<TensorEntry*> named;
  for (TensorEntry* entry : bucket.entries) {
    if (entry->state != nullptr) named.push_back(entry);
  }
  const std::string where = " in process set " + std::to_string(bucket.process_set);
  if (named.empty()) return "a joined rank's stand-in allreduce" + where;
  return DescribeBucket(OpTypeName(named.front()->op), named, 3) + " on " +
         DeviceName(named.front()->input.device) + where;
}

}  // namespace gradsync
