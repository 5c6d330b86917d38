// QueryPacer: when to look again at an event whose query contends with the trainer's launches
// (StreamEvent::QueryContends: a CUDA event's query takes the driver's lock that kernel launches
// take too). A thread waiting for such an event looks again a sixteenth of the time it has waited
// so far after each look, from a shortest gap to a millisecond: a completion is seen at most about
// 6% of its latency late (or a millisecond, or the shortest gap, late). With the shortest gap of
// half a microsecond, for a bucket's completion that may come within microseconds of its launch
// (the finalizer's looks), a wait of 1 ms costs about 100 queries and one of 20 ms about 160; with
// kProducerGap, for a producer that a backward keeps busy (a host stream's looks: the MPI
// backend's), about 35 and 85.
//
// Thread safety: QueryPacer is a plain value; PauseUntil blocks only its caller.
#pragma once

#include <chrono>
#include <thread>

namespace gradsync {

class QueryPacer {
 public:
  using Clock = std::chrono::steady_clock;
  // `since`: when the wait began (a bucket's launch, a stream reaching the event).
  explicit QueryPacer(Clock::time_point since,
                      std::chrono::nanoseconds shortest_gap = std::chrono::nanoseconds(500))
      : since_(since), next_(since), shortest_gap_(shortest_gap) {}

  bool Due(Clock::time_point now) const { return now >= next_; }
  // The event was looked at, at `now`, and had not completed.
  void Looked(Clock::time_point now);
  Clock::time_point next() const { return next_; }

 private:
  Clock::time_point since_;
  Clock::time_point next_;
  std::chrono::nanoseconds shortest_gap_;
};

// The shortest gap between looks at a producer's event: a gradient's kernels, which the host has
// usually run ahead of by a millisecond or more, so looks microseconds apart would mostly take
// the driver's lock from the backward's launches for nothing.
constexpr std::chrono::microseconds kProducerGap(20);

// A pause shorter than this is spent yielding rather than asleep: Linux stretches a short sleep to
// the thread's timer slack (a 2 us sleep lasted 67 us on a 2-core VM), as long as the pause again.
constexpr std::chrono::microseconds kShortestSleep(100);

// Blocks the calling thread until `until`: between yields when that is nearer than
// kShortestSleep, asleep otherwise.
inline void PauseUntil(std::chrono::steady_clock::time_point until) {
  if (until - std::chrono::steady_clock::now() >= kShortestSleep) {
    std::this_thread::sleep_until(until);
    return;
  }
  while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
}

}  // namespace gradsync
