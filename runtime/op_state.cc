#include "runtime/op_state.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace gradsync {

void OpState::RunCallback(const Status& status) {
  Callback callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    callback = std::move(callback_);
  }
  if (!callback) return;
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
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) {
    std::fprintf(stderr, "gradsync: internal error: operation completed twice\n");
    std::abort();
  }
  done_ = true;
  status_ = status;
}

// Record() changed done_ under the mutex, so a waiter has either seen it or is already waiting.
void OpState::Announce() { cv_.notify_all(); }

bool OpState::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status OpState::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  return status_;
}

bool OpState::WaitFor(std::chrono::nanoseconds timeout, Status* status) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return done_; })) return false;
  *status = status_;
  return true;
}

Status OpState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

}  // namespace gradsync
