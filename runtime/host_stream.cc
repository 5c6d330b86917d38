#include "runtime/host_stream.h"

#include <algorithm>
#include <string>
#include <utility>

#include "runtime/query_pacer.h"
#include "runtime/yield_until.h"

namespace gradsync {
namespace {

// How often a stream waiting for another stream's event looks for an abort of its own.
constexpr std::chrono::milliseconds kWaitSlice(2);
// How long the stream's thread looks for more work, and a waiter for an event, between yields,
// before it sleeps.
constexpr std::chrono::microseconds kLookForWork(100);

}  // namespace

bool HostEvent::Query() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status HostEvent::Wait(std::chrono::nanoseconds timeout) {
  timeout = std::min(timeout, kWaitForever);  // a deadline the clock can hold
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  const auto done = [this] { return done_; };
  if (!done_ && timeout > kLookForWork) {
    // A caller ordering its stream after the MPI backend's work, or a stream waiting for another,
    // mostly sees the event complete within microseconds; woken from a sleep it would take about
    // as long again.
    YieldUntil(&lock, start + kLookForWork, done);
  }
  if (!cv_.wait_until(lock, start + timeout, done)) {
    return Status::Timeout("the stream's work before this event has not finished after " +
                           std::to_string(std::chrono::duration<double>(timeout).count()) + " s");
  }
  return status_;
}

bool HostEvent::CompletedAt(std::chrono::steady_clock::time_point* at) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_ || !status_.ok()) return false;
  *at = completed_at_;
  return true;
}

bool HostEvent::NotifyOnCompletion(const std::shared_ptr<CompletionListener>& listener) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) listener_ = listener;
  return true;
}

void HostEvent::Complete(const Status& status) {
  const auto now = std::chrono::steady_clock::now();
  std::shared_ptr<CompletionListener> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = status;
    completed_at_ = now;
    listener = std::move(listener_);
  }
  // Outside the lock, which the listener's thread takes next to query this event.
  if (listener != nullptr) listener->EventCompleted();
  cv_.notify_all();
}

HostStream::HostStream() : thread_(&HostStream::Run, this) {}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostStream::Enqueue(std::function<void()> work) { Push({std::move(work), nullptr, nullptr}); }

std::shared_ptr<StreamEvent> HostStream::Record() {
  auto event = std::make_shared<HostEvent>();
  Push({nullptr, nullptr, event});
  return event;
}

void HostStream::WaitFor(std::shared_ptr<StreamEvent> event) {
  Push({nullptr, std::move(event), nullptr});
}

void HostStream::Push(Item item) {
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_ && !stopping_) {
      items_.push_back(std::move(item));
      // Only a sleeping stream needs the system call: a running one finds the item itself.
      if (std::exchange(sleeping_, false)) cv_.notify_all();
      return;
    }
    refused = aborted_ ? abort_status_ : Status::Shutdown("the stream was destroyed first");
  }
  // A failed stream runs nothing, and its events complete at once with the failure.
  if (item.record) item.record->Complete(refused);
}

bool HostStream::running() {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

void HostStream::Abort(const Status& status) {
  std::deque<Item> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_status_ = status;
    dropped.swap(items_);
  }
  cv_.notify_all();
  for (Item& item : dropped) {
    if (item.record) item.record->Complete(status);
  }
}

void HostStream::AwaitEvent(StreamEvent* event) {
  bool settled = false;
  if (event->QueryContends()) {
    settled = AwaitContendingEvent(event);
  } else {
    while (!(settled = event->Query())) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (aborted_ || stopping_) break;
      }
      event->Wait(kWaitSlice);
    }
  }
  if (!settled) return;  // ended by an abort or the destructor
  const Status waited = event->Wait(std::chrono::nanoseconds(0));
  if (!waited.ok()) {
    Abort(Status(waited.code(), "the stream waited for work that failed: " + waited.message()));
  }
}

// The MPI backend's stream waiting for a producer's kernels on the GPU. Looked at after pauses
// doubling from 20 us, in slices of 2 ms that each began again with the shortest, such an event
// was seen up to as late again as it had taken (one completing 650 us into the wait, at 1.26 ms).
bool HostStream::AwaitContendingEvent(StreamEvent* event) {
  QueryPacer pacer(std::chrono::steady_clock::now(), kProducerGap);
  const auto stopped = [this] { return aborted_ || stopping_; };
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped()) {
    lock.unlock();
    if (event->Query()) return true;
    const auto now = std::chrono::steady_clock::now();
    pacer.Looked(now);
    lock.lock();
    if (stopped()) return false;
    if (pacer.next() - now < kShortestSleep) {
      YieldUntil(&lock, pacer.next(), stopped);
    } else {
      cv_.wait_until(lock, pacer.next(), stopped);
    }
  }
  return false;
}

void HostStream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto has_work = [this] { return stopping_ || !items_.empty(); };
  for (;;) {
    // Work comes in runs (a bucket's copies and collective, then the next bucket's), and waking a
    // sleeping thread for each run cost a small operation over this stream about half its time at
    // 1 rank (12 us against 6 us).
    if (!has_work()) YieldUntil(&lock, std::chrono::steady_clock::now() + kLookForWork, has_work);
    if (!has_work()) {
      sleeping_ = true;
      cv_.wait(lock, has_work);
      sleeping_ = false;
    }
    if (stopping_) break;
    Item item = std::move(items_.front());
    items_.pop_front();
    running_ = true;
    lock.unlock();
    if (item.wait_for) {
      AwaitEvent(item.wait_for.get());
    } else if (item.record) {
      Status status;
      {
        std::lock_guard<std::mutex> state(mu_);
        if (aborted_) status = abort_status_;
      }
      item.record->Complete(status);
    } else if (item.work) {
      item.work();
    }
    lock.lock();
    running_ = false;
  }
  // Work not started is dropped; whoever waits on its events learns that it never ran.
  std::deque<Item> dropped;
  dropped.swap(items_);
  lock.unlock();
  for (Item& item : dropped) {
    if (item.record) item.record->Complete(Status::Shutdown("the stream was destroyed first"));
  }
}

}  // namespace gradsync
