#include "runtime/op_state.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

namespace gradsync {

namespace {

// One for every operation of the process. A waiter counts itself in `sleeping` before it checks its
// flag, and the announcer checks `sleeping` after every flag of its batch is set (both sequentially
// consistent), so at least one of them sees the other: a waiter never sleeps through its own
// completion, and a batch nobody waits for costs one atomic load.
struct SleepingWaiters {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> sleeping{0};
};

// Never destroyed: a handle may be waited on from a static destructor.
SleepingWaiters& Waiters() {
  static auto* waiters = new SleepingWaiters;
  return *waiters;
}

// A small device operation completes within tens of microseconds of its submission, and a thread
// woken from a sleep takes about as long again to run: its waiter polls this long first. Host
// operations do not: their waiter's core is what the background thread may need.
constexpr std::chrono::microseconds kDevicePollWindow(100);

// Whether `settled()` came true within the poll window (never looked for again when the operation
// is a host one).
template <typename Settled>
bool Polled(const Settled& settled, bool on_device, std::chrono::steady_clock::time_point limit) {
  if (!on_device) return settled();
  const auto end = std::min(limit, std::chrono::steady_clock::now() + kDevicePollWindow);
  while (!settled()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::yield();
  }
  return true;
}

// Sleeps until `settled()` or `deadline`. The waiter counts itself in `sleeping` before it looks
// (sequentially consistent), so an announcement made after its flag is set cannot miss it.
template <typename Settled>
void SleepUntil(const Settled& settled, std::chrono::steady_clock::time_point deadline) {
  SleepingWaiters& waiters = Waiters();
  std::unique_lock<std::mutex> lock(waiters.mu);
  waiters.sleeping.fetch_add(1, std::memory_order_seq_cst);
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    while (!settled()) waiters.cv.wait(lock);
  } else {
    while (!settled() && waiters.cv.wait_until(lock, deadline) != std::cv_status::timeout) {
    }
  }
  waiters.sleeping.fetch_sub(1, std::memory_order_relaxed);
}

void WakeSleepers() {
  SleepingWaiters& waiters = Waiters();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiters.sleeping.load(std::memory_order_seq_cst) == 0) return;
  // Taking the lock orders this wake-up after any waiter that counted itself has gone to sleep.
  { std::lock_guard<std::mutex> lock(waiters.mu); }
  waiters.cv.notify_all();
}

std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::nanoseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  return timeout >= std::chrono::steady_clock::time_point::max() - now
             ? std::chrono::steady_clock::time_point::max()
             : now + timeout;
}

}  // namespace

void OpState::Renew(std::shared_ptr<OpState>* state, Callback callback) {
  // use_count() reads the count relaxed; the fence orders this reuse after the last other holder's
  // release (its decrement), so none of its accesses can race with the reset below.
  if (*state == nullptr || state->use_count() != 1) {
    *state = std::make_shared<OpState>(std::move(callback));
    return;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  OpState& op = **state;
  op.done_.store(false, std::memory_order_relaxed);
  // Each assignment only when it changes something: most operations succeed and have no callback.
  if (!op.status_.ok()) op.status_ = Status::OK();
  if (callback || op.callback_) op.callback_ = std::move(callback);
  if (op.has_launched_.load(std::memory_order_relaxed)) {
    op.launched_.reset();
    op.has_launched_.store(false, std::memory_order_relaxed);
  }
  op.on_device = false;
  op.output_shape.clear();
  op.received_splits.clear();
  op.result = 0;
}

void OpState::SetLaunched(std::shared_ptr<StreamEvent> event) {
  if (has_launched_.load(std::memory_order_relaxed)) {
    std::fprintf(stderr, "gradsync: internal error: operation launched twice\n");
    std::abort();
  }
  launched_ = std::move(event);
  has_launched_.store(true, std::memory_order_release);
}

void OpState::AnnounceLaunches() { WakeSleepers(); }

// Launching follows negotiation, which takes microseconds to a cycle: a device operation's waiter
// polls first, since a timed sleep of a few microseconds lasts the kernel's timer slack (50 us
// and more) whatever it asks for.
std::shared_ptr<StreamEvent> OpState::WaitLaunched(std::chrono::nanoseconds timeout,
                                                   bool* timed_out) {
  const auto deadline = DeadlineAfter(timeout);
  const auto settled = [this] {
    return has_launched_.load(std::memory_order_seq_cst) || done_.load(std::memory_order_seq_cst);
  };
  if (!Polled(settled, on_device, deadline)) SleepUntil(settled, deadline);
  // Done is read first: an operation is launched before it is done, so a done one that had an
  // event shows it below.
  const bool finished = done();
  *timed_out = false;
  if (launched()) return launched_;
  *timed_out = !finished;
  return nullptr;
}

void OpState::RunCallback(const Status& status) {
  if (!callback_) return;
  Callback callback = std::move(callback_);
  // An exception must not escape onto the background thread, which would end the process.
  try {
    callback(status);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsync: a completion callback threw: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "gradsync: a completion callback threw a non-standard exception\n");
  }
}

void OpState::Record(const Status& status) {
  if (done_.load(std::memory_order_relaxed)) {
    std::fprintf(stderr, "gradsync: internal error: operation completed twice\n");
    std::abort();
  }
  if (!status.ok()) status_ = status;  // Renew left it OK: copying OK would cost a string copy
  done_.store(true, std::memory_order_release);
}

void OpState::AnnounceCompletions() { WakeSleepers(); }

const Status& OpState::Wait() {
  const auto forever = std::chrono::steady_clock::time_point::max();
  const auto settled = [this] { return done_.load(std::memory_order_seq_cst); };
  if (!Polled(settled, on_device, forever)) SleepUntil(settled, forever);
  return status_;
}

bool OpState::WaitFor(std::chrono::nanoseconds timeout, Status* status) {
  const auto deadline = DeadlineAfter(timeout);
  const auto settled = [this] { return done_.load(std::memory_order_seq_cst); };
  if (!Polled(settled, on_device, deadline)) {
    SleepUntil(settled, deadline);
    if (!done()) return false;
  }
  *status = status_;
  return true;
}

}  // namespace gradsync
