// Handle's members: waiting on, polling and stream-ordering after an enqueued operation.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
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
  gradsync::synchronize_stream({*this}, cuda_stream);
}

void synchronize_stream(const std::vector<Handle>& handles, void* cuda_stream) {
  RequireCallerThread("synchronize_stream");
  // Held, not just compared by address: a completion freed meanwhile could give its address to
  // another.
  std::vector<std::shared_ptr<StreamEvent>> ordered;
  std::optional<Error> first_failure;
  for (const Handle& handle : handles) {
    try {
      if (!handle.state_) Throw(Status::InvalidArgument("synchronize_stream() on an empty handle"));
      NoteCallerWait(*handle.state_);  // each handle counts as a wait, ordered or not
      bool timed_out = false;
      std::shared_ptr<StreamEvent> launched = handle.state_->WaitLaunched(kWaitForever, &timed_out);
      if (launched == nullptr) {
        // Ran on the host, or failed before launch: its completion is the handle's.
        handle.wait();
        continue;
      }
      if (std::find(ordered.begin(), ordered.end(), launched) != ordered.end()) continue;
      ordered.push_back(launched);
      const Status status = OrderStreamAfter(launched, cuda_stream);
      if (!status.ok()) Throw(status);
    } catch (const Error& e) {
      if (!first_failure) first_failure = e;
    }
  }
  if (first_failure) throw *first_failure;
}

std::vector<int64_t> Handle::received_splits() const {
  if (!state_ || !state_->done()) return {};
  return state_->received_splits;
}

}  // namespace gradsync
