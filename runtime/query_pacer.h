// QueryPacer: when to look again at an event whose query contends with the trainer's launches
// (StreamEvent::QueryContends: a CUDA event's query takes the driver's lock that kernel launches
// take too). A thread waiting for such an event looks again a sixteenth of the time it has waited
// so far after each look, from half a microsecond to a millisecond: a completion is seen at most
// about 6% of its latency late (or a millisecond late), and a wait of 1 ms costs about 100
// queries, one of 20 ms about 160. The finalizer paces its looks at a bucket's event so, and a
// host stream (the MPI backend's) its looks at a producer's event.
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
  explicit QueryPacer(Clock::time_point since) : since_(since), next_(since) {}

  bool Due(Clock::time_point now) const { return now >= next_; }
  // The event was looked at, at `now`, and had not completed.
  void Looked(Clock::time_point now);
  Clock::time_point next() const { return next_; }

 private:
  Clock::time_point since_;
  Clock::time_point next_;
};

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
