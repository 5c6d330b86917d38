// The soak's command line.
#pragma once

#include <cstdint>
#include <string>

namespace gradsync {
namespace soak {

enum class TimelineMode {
  kOff,
  kWhole,    // GRADSYNC_TIMELINE: one file for the whole run
  kWindows,  // start_timeline / stop_timeline around windows of steps, each checked and deleted
};

struct Options {
  int64_t steps = 200;
  uint64_t seed = 1;
  int64_t report_every = 0;  // 0: a tenth of the steps
  int pool = 256;            // tensor names
  int max_ops = 16;          // operations (templates) per step, at most
  double join_chance = 0.02;
  double added_set_chance = 0.01;
  double unnamed_chance = 0.2;
  // Non-zero: step s runs the plan of step s % repeat_every, so every size the run will see has
  // been seen once the first round is done, and growth after that is not a high-water mark.
  int64_t repeat_every = 0;
  // Non-zero: the steady mode (soak_plan.h), stretches of this many identical steps, without the
  // process sets created at init (the global set locks only while it is the only set).
  int64_t steady_steps = 0;
  // Every tensor labelled cuda:0 and reduced through the device plane over the host backend (no
  // GPU needed), half of them written by a producer stream after their enqueue.
  bool device_tensors = false;
  double wait_seconds = 60;  // per step, for all its handles
  double hang_seconds =
      0;  // a blocking call (join, shutdown, ...) longer than this aborts; 0: auto
  double rss_bound_mib = 8;   // allowed growth of the resident set after the warm-up
  double heap_bound_mib = 4;  // allowed growth of malloc's bytes in use after the warm-up
  double warmup = 0.1;        // fraction of the steps before memory is held to the bound
  // False under AddressSanitizer: its allocator holds freed blocks in quarantine, so the resident
  // set grows by design and malloc's own counters read zero. LeakSanitizer checks leaks instead.
  bool memory_bounds = true;
  TimelineMode timeline = TimelineMode::kWhole;
  int64_t window = 100;         // steps per timeline window
  int64_t window_every = 1000;  // a window starts every this many steps
  bool keep_timeline = false;
};

extern const char* const kUsage;

// Fills `options` from the flags; on a bad flag returns false with the reason in *error.
bool ParseOptions(int argc, char** argv, Options* options, std::string* error);

}  // namespace soak
}  // namespace gradsync
