// Test double for a device's event: its query contends with launches (StreamEvent::QueryContends),
// it completes at a set time (with a set status), and it notes when it was queried, so that a test
// can hold a waiter's looks to QueryPacer's gaps.
//
// Thread safety: any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/query_pacer.h"
#include "runtime/stream.h"

namespace gradsync {

class ContendingEvent : public StreamEvent {
 public:
  explicit ContendingEvent(std::chrono::steady_clock::time_point done_at, Status status = Status())
      : done_at_(done_at), status_(std::move(status)) {}
  bool Query() override {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    queries_.push_back(now);
    return now >= done_at_;
  }
  Status Wait(std::chrono::nanoseconds timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::this_thread::sleep_until(std::min(until, done_at_));
    return Query() ? status_ : Status::Timeout("not yet");
  }
  bool QueryContends() const override { return true; }
  std::vector<std::chrono::steady_clock::time_point> queries() {
    std::lock_guard<std::mutex> lock(mu_);
    return queries_;
  }

 private:
  const std::chrono::steady_clock::time_point done_at_;
  const Status status_;
  std::mutex mu_;
  std::vector<std::chrono::steady_clock::time_point> queries_;
};

// How many of `queries` (looks at an event waited for since `since`) came sooner than half the
// gap after the look before of a pacer with `shortest_gap` (half: a look may run a little after the
// moment its waiter chose for it). Looks before `since` are not counted.
inline int LooksSoonerThanPaced(
    const std::vector<std::chrono::steady_clock::time_point>& queries,
    std::chrono::steady_clock::time_point since,
    std::chrono::nanoseconds shortest_gap = std::chrono::nanoseconds(500)) {
  int too_soon = 0;
  for (size_t i = 1; i < queries.size(); ++i) {
    if (queries[i - 1] < since) continue;
    QueryPacer pacer(since, shortest_gap);
    pacer.Looked(queries[i - 1]);
    const auto gap = pacer.next() - queries[i - 1];
    if (queries[i] - queries[i - 1] < gap / 2) ++too_soon;
  }
  return too_soon;
}

}  // namespace gradsync
