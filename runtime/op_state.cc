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

// Whether `op` completed within the poll window (never when it is a host operation).
bool PolledDone(const OpState& op, bool on_device, std::chrono::steady_clock::time_point limit) {
  if (!on_device) return op.done();
  const auto end = std::min(limit, std::chrono::steady_clock::now() + kDevicePollWindow);
  while (!op.done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::yield();
  }
  return true;
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
  if (op.launched_ != nullptr) std::atomic_store(&op.launched_, std::shared_ptr<StreamEvent>());
  op.on_device = false;
  op.output_shape.clear();
  op.received_splits.clear();
  op.result = 0;
}

void OpState::SetLaunched(std::shared_ptr<StreamEvent> event) {
  std::atomic_store(&launched_, std::move(event));
}

// Launching follows negotiation, which takes microseconds to a cycle: a short poll is cheaper
// than a condition per operation.
std::shared_ptr<StreamEvent> OpState::WaitLaunched(std::chrono::nanoseconds timeout,
                                                   bool* timed_out) {
  *timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(2);
  for (;;) {
    // Done is read first: an operation is launched before it is done, so a done one that had an
    // event shows it below.
    const bool finished = done();
    std::shared_ptr<StreamEvent> event = std::atomic_load(&launched_);
    if (event != nullptr || finished) return event;
    if (std::chrono::steady_clock::now() >= deadline) {
      *timed_out = true;
      return nullptr;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
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

void OpState::AnnounceCompletions() {
  SleepingWaiters& waiters = Waiters();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiters.sleeping.load(std::memory_order_seq_cst) == 0) return;
  // Taking the lock orders this wake-up after any waiter that counted itself has gone to sleep.
  { std::lock_guard<std::mutex> lock(waiters.mu); }
  waiters.cv.notify_all();
}

const Status& OpState::Wait() {
  if (!PolledDone(*this, on_device, std::chrono::steady_clock::time_point::max())) {
    SleepingWaiters& waiters = Waiters();
    std::unique_lock<std::mutex> lock(waiters.mu);
    waiters.sleeping.fetch_add(1, std::memory_order_seq_cst);
    while (!done_.load(std::memory_order_seq_cst)) waiters.cv.wait(lock);
    waiters.sleeping.fetch_sub(1, std::memory_order_relaxed);
  }
  return status_;
}

bool OpState::WaitFor(std::chrono::nanoseconds timeout, Status* status) {
  const auto now = std::chrono::steady_clock::now();
  const auto deadline = timeout >= std::chrono::steady_clock::time_point::max() - now
                            ? std::chrono::steady_clock::time_point::max()
                            : now + timeout;
  if (!PolledDone(*this, on_device, deadline)) {
    SleepingWaiters& waiters = Waiters();
    std::unique_lock<std::mutex> lock(waiters.mu);
    waiters.sleeping.fetch_add(1, std::memory_order_seq_cst);
    while (!done_.load(std::memory_order_seq_cst) &&
           waiters.cv.wait_until(lock, deadline) != std::cv_status::timeout) {
    }
    waiters.sleeping.fetch_sub(1, std::memory_order_relaxed);
    if (!done()) return false;
  }
  *status = status_;
  return true;
}

}  // namespace gradsync
