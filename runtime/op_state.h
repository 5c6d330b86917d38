// OpState: the shared completion record behind a public Handle.
//
// Owns the final Status, the completion flag and an optional callback. The background thread
// completes it once, in three steps (below); Wait*/done/status may be called from any thread at any
// time. The callback has returned before waiters see the operation done.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

class OpState {
 public:
  using Callback = std::function<void(const Status&)>;

  explicit OpState(Callback callback = nullptr) : callback_(std::move(callback)) {}

  // Completion in steps, so many operations complete at once: RunCallback() and Record() every one
  // first, then Announce() each. A thread waiting on the first then finds the rest already done
  // instead of sleeping and being woken once per operation. A second Record() aborts.
  void RunCallback(const Status& status);
  void Record(const Status& status);
  void Announce();

  bool done() const;
  // Blocks until Record(); returns the final status.
  Status Wait();
  // Returns false if `timeout` passes first; otherwise true and *status holds the result.
  bool WaitFor(std::chrono::nanoseconds timeout, Status* status);
  // The final status once done; OK while pending.
  Status status() const;

  // Allgather, reducescatter, alltoall: the output shape, set by the background thread before
  // Record().
  std::vector<int64_t> output_shape;
  // Alltoall: rows received from each rank, in rank order; set before Record().
  std::vector<int64_t> received_splits;
  // Join: the last rank to join. Add process set: the new set's id. Set before Record().
  int32_t result = 0;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  Callback callback_;
};

}  // namespace gradsync
