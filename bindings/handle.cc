// Handle's members: waiting on, polling and stream-ordering after an enqueued operation.
#include <algorithm>
#include <chrono>
#include <functional>
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

void OrderStreamAfterHandles(const Handle* handles, size_t count, void* cuda_stream,
                             const char* call,
                             const std::function<void(size_t, const Error&)>& failed) {
  RequireCallerThread(call);
  // The completions ordered after so far, with their failures, for a later handle that shares
  // one. Held, not just compared by address: one freed meanwhile could give its address to another.
  struct Ordered {
    std::shared_ptr<StreamEvent> event;
    std::optional<Error> error;
  };
  std::vector<Ordered> ordered;
  for (size_t i = 0; i < count; ++i) {
    const Handle& handle = handles[i];
    std::optional<Error> error;
    try {
      if (!handle.state_) Throw(Status::InvalidArgument("synchronize_stream() on an empty handle"));
      NoteCallerWait(*handle.state_);  // each handle counts as a wait, ordered or not
      bool timed_out = false;
      std::shared_ptr<StreamEvent> launched = handle.state_->WaitLaunched(kWaitForever, &timed_out);
      if (launched == nullptr) {
        handle.wait();  // ran on the host, or failed before launch: its completion is the handle's
        continue;
      }
      const auto same = std::find_if(ordered.begin(), ordered.end(),
                                     [&](const Ordered& o) { return o.event == launched; });
      if (same != ordered.end()) {
        error = same->error;
      } else {
        const Status status = OrderStreamAfter(launched, cuda_stream);
        if (!status.ok()) error = Error(status);
        // A single handle (Handle::synchronize_stream) needs no list.
        if (i + 1 < count) ordered.push_back({std::move(launched), error});
      }
    } catch (const Error& e) {
      error = e;
    }
    if (error) failed(i, *error);
  }
}

void Handle::synchronize_stream(void* cuda_stream) const {
  std::optional<Error> failure;
  OrderStreamAfterHandles(this, 1, cuda_stream, "Handle::synchronize_stream",
                          [&](size_t, const Error& e) { failure = e; });
  if (failure) throw *failure;
}

void synchronize_stream(const std::vector<Handle>& handles, void* cuda_stream) {
  std::optional<Error> first_failure;
  OrderStreamAfterHandles(handles.data(), handles.size(), cuda_stream, "synchronize_stream",
                          [&](size_t, const Error& e) {
                            if (!first_failure) first_failure = e;
                          });
  if (first_failure) throw *first_failure;
}

std::vector<int64_t> Handle::received_splits() const {
  if (!state_ || !state_->done()) return {};
  return state_->received_splits;
}

}  // namespace gradsync
