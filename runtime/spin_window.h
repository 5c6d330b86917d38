// SpinWindow: how long a thread that is handed work at irregular moments (the finalizer, given
// each launched bucket) goes on looking for the next piece between yields before it sleeps.
// Waking a sleeping thread costs the thread that hands it work a system call: over a no-op
// device backend at 1 rank of a 2-core VM, about 6 us of a locked bucket's 13 us host launch,
// paid by the caller in the middle of its backward pass. Looking between yields costs only the
// looking thread's otherwise idle time. So the window is twice the longest of the recent gaps
// between arrivals, from `shortest` up to `longest`: the buckets of a step, launched a few
// hundred microseconds apart while the host runs the backward's launches, then find the thread
// awake, and a gap longer than half of `longest` (the one between two steps, or between the
// buckets of a long backward) is slept through, where one wake-up is small against the gap.
// The last kRemembered gaps count, so a run whose arrivals thin out goes back to `shortest`.
//
// Idle time is not always free: where threads outnumber cores (ranks sharing cores, a data
// loader's workers), a yield hands the core to a thread with work for it, and taking it back at
// every turn slows that thread. So past `shortest`, a yield that returned `wanted` or more late
// ends the window until the next arrival.
//
// Thread safety: a plain value, used by one thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>

namespace gradsync {

class SpinWindow {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kRemembered = 8;

  SpinWindow(Clock::duration shortest, Clock::duration longest, Clock::duration wanted)
      : shortest_(shortest), longest_(longest), wanted_(wanted), window_(shortest) {}

  // Work arrived at `at`; arrivals are given in the order they came. Until the next arrival the
  // window widens past `shortest` only if `may_widen` (the finalizer: not after a bucket that a
  // host thread runs, which needs a core for it).
  void Arrived(Clock::time_point at, bool may_widen = true);
  // Whether to go on looking between yields, `idle` after the last work.
  bool Spins(Clock::duration idle) const {
    return idle < shortest_ || (idle < window_ && may_widen_ && !core_wanted_);
  }
  // A yield made `idle` after the last work took `took`.
  void Yielded(Clock::duration idle, Clock::duration took) {
    if (idle >= shortest_ && took >= wanted_) core_wanted_ = true;
  }
  // The window while the core is not wanted.
  Clock::duration window() const { return window_; }

 private:
  Clock::duration shortest_;
  Clock::duration longest_;
  Clock::duration wanted_;
  Clock::duration window_;
  bool core_wanted_ = false;
  bool may_widen_ = true;
  Clock::time_point last_;
  bool any_ = false;
  // The last kRemembered gaps, ring-ordered; zero where none was yet, or the gap was too long
  // to spin through.
  std::array<Clock::duration, kRemembered> gaps_{};
  size_t next_ = 0;
};

}  // namespace gradsync
