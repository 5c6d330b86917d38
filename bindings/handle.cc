// Handle's members: waiting on, polling and stream-ordering after an enqueued operation.
#include <chrono>
#include <memory>
#include <vector>

#include "bindings/runtime.h"
#include "gradsync/gradsync.h"
#include "ops/device/device_events.h"
#include "runtime/op_state.h"

namespace gradsync {

void Handle::wait() const {
  RequireCallerThread("Handle::wait");
  if (!state_) Throw(Status::InvalidArgument("wait() on an empty handle"));
  NoteCallerWait(*state_);
  const Status& status = state_->Wait();  // no copy: every handle of a step is waited on
  if (!status.ok()) Throw(status);
}

bool Handle::wait_for(std::chrono::nanoseconds timeout) const {
  RequireCallerThread("Handle::wait_for");
  if (!state_) Throw(Status::InvalidArgument("wait_for() on an empty handle"));
  NoteCallerWait(*state_);
  Status status;
  if (!state_->WaitFor(timeout, &status)) return false;
  if (!status.ok()) Throw(status);
  return true;
}

bool Handle::poll() const { return state_ && state_->done(); }

Status Handle::status() const { return state_ ? state_->status() : Status::OK(); }

std::vector<int64_t> Handle::output_shape() const {
  if (!state_ || !state_->done()) return {};
  return state_->output_shape;
}

void Handle::synchronize_stream(void* cuda_stream) const {
  RequireCallerThread("Handle::synchronize_stream");
  if (!state_) Throw(Status::InvalidArgument("synchronize_stream() on an empty handle"));
  NoteCallerWait(*state_);
  bool timed_out = false;
  const std::shared_ptr<StreamEvent> launched = state_->WaitLaunched(kWaitForever, &timed_out);
  if (launched == nullptr) {
    // Ran on the host, or failed before launch: its completion is the handle's.
    wait();
    return;
  }
  const Status ordered = OrderStreamAfter(launched, cuda_stream);
  if (!ordered.ok()) Throw(ordered);
}

std::vector<int64_t> Handle::received_splits() const {
  if (!state_ || !state_->done()) return {};
  return state_->received_splits;
}

}  // namespace gradsync
