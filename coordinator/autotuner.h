// Autotuner (GRADSYNC_AUTOTUNE): refines a process set's in-place cutoff, bucket size and (for the
// global set) cycle time from the step times the first steps of training show, starting from
// the calibrated settings.
//
// A step is found without the application's help: training runs the same tensors every step, so
// the first allreduce name executed after tuning starts marks the steps; each time it is executed
// again a step has passed. A window is kStepsPerWindow steps; its time, the slowest rank's, scores
// the settings it ran with. The search goes one parameter at a time (coordinate descent): the
// starting settings get a window, then each other candidate of the first parameter, the best
// value is kept, then the next parameter. After 1 + 3 x 3 windows every parameter is settled and
// the best settings seen are kept for the rest of the job, so tuning ends within 30 steps.
//
// Every rank sees the same names in the same cycles, so every rank ends each window in the same
// cycle; with the same (reduced) times, every rank makes the same choices.
//
// Pure logic, no MPI and no clock: the caller measures and reduces. One thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradsync {

struct TunableSettings {
  int64_t inplace_threshold_bytes = 0;
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 1.0;

  bool operator==(const TunableSettings& o) const {
    return inplace_threshold_bytes == o.inplace_threshold_bytes &&
           fusion_threshold_bytes == o.fusion_threshold_bytes && cycle_time_ms == o.cycle_time_ms;
  }
};

// Which settings a tuner may change: not one the user set (GRADSYNC_INPLACE_THRESHOLD,
// GRADSYNC_FUSION_THRESHOLD), nor the cycle time of a process set other than the global one,
// which share the loop's cycle.
struct TunedParameters {
  bool inplace_threshold = true;
  bool fusion_threshold = true;
  bool cycle_time = true;
};

class Autotuner {
 public:
  static constexpr int kStepsPerWindow = 3;

  // `start`: the calibrated settings. `max_fusion`: GRADSYNC_FUSION_THRESHOLD, which no candidate
  // exceeds.
  Autotuner(const TunableSettings& start, int64_t max_fusion, const TunedParameters& tuned);

  bool done() const { return done_; }
  // What to plan with now: the candidate being measured, or once done, the best seen.
  const TunableSettings& current() const { return done_ ? best_ : candidate_; }
  // The settings it started from.
  const TunableSettings& start() const { return start_; }

  // One finished window: its time in seconds (the slowest rank's). Moves to the next candidate.
  // Returns the trajectory line for the log: window, parameter, the settings, the step time and
  // whether they are the best so far.
  std::string Record(double window_seconds);

  // The log file's first line, naming the columns of Record's lines.
  static std::string Header();

 private:
  // Fills pending_ with the untried values of the current parameter (moving past parameters with
  // none).
  void PlanParameter();

  std::vector<const char*> order_;
  size_t parameter_ = 0;                  // index into order_
  std::vector<TunableSettings> pending_;  // candidates of this parameter still to measure
  TunableSettings start_;
  TunableSettings candidate_;
  TunableSettings best_;
  double best_seconds_ = 0;
  bool measured_start_ = false;
  int window_ = 0;
  int64_t max_fusion_;
  bool done_ = false;
};

}  // namespace gradsync
