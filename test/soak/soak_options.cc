// The soak's command line; see soak_options.h.
#include "test/soak/soak_options.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

namespace gradsync {
namespace soak {

const char* const kUsage =
    "usage: mpirun -np 4 gradsync_soak [flags]\n"
    "  --steps N            steps to run (200)\n"
    "  --seed S             seed of every plan (1); the same seed replays the same run\n"
    "  --report-every K     sample memory and print progress every K steps (steps / 10)\n"
    "  --pool P             tensor names in the pool (256)\n"
    "  --max-ops M          operations per step, at most (16)\n"
    "  --join-chance P      chance of a step being a join step (0.02)\n"
    "  --added-set-chance P chance of a step adding, using and removing a process set (0.01)\n"
    "  --unnamed-chance P   chance of a step also running operations with generated names (0.2)\n"
    "  --repeat-every N     step s reruns the plan of step s % N: a leak check with no new\n"
    "                       high-water marks after the first N steps (0: off)\n"
    "  --steady-steps S     stretches of S identical steps of allreduces and broadcasts, each\n"
    "                       followed by a step that deviates from it and a random one, without\n"
    "                       the process sets made at init, so that the schedule locks and\n"
    "                       unlocks; the timeline must show it ran locked (0: off)\n"
    "  --device-tensors     every tensor a device tensor (cuda:0 in host memory) through the\n"
    "                       device plane over the host backend, the path a GPU's tensors take;\n"
    "                       half of them written by a producer stream after their enqueue\n"
    "  --wait-seconds W     a step's handles must all complete within W s (60)\n"
    "  --hang-seconds H     abort the job when a blocking call takes longer (2 W + 30)\n"
    "  --rss-bound-mib B    allowed growth of resident memory outside node shared memory and\n"
    "                       stand-in device memory after the warm-up (8)\n"
    "  --heap-bound-mib B   allowed growth of malloc's bytes in use outside stand-in device\n"
    "                       memory after the warm-up (4)\n"
    "  --warmup-fraction F  share of the steps before the bound applies (0.1)\n"
    "  --no-memory-bounds   sample and report memory but hold it to no bound (sanitized\n"
    "                       builds, whose allocator keeps freed memory in quarantine)\n"
    "  --timeline MODE      whole (GRADSYNC_TIMELINE for the whole run), windows, or off (whole)\n"
    "  --window N           steps per timeline window (100)\n"
    "  --window-every N     steps from one window's start to the next (1000)\n"
    "  --keep-timeline      keep the timeline files and print where they are\n";

namespace {

bool ParseInt(const char* text, int64_t low, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < low) return false;
  *out = v;
  return true;
}

bool ParseDouble(const char* text, double low, double* out) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v >= low)) return false;
  *out = v;
  return true;
}

}  // namespace

bool ParseOptions(int argc, char** argv, Options* o, std::string* error) {
  int64_t pool = o->pool, max_ops = o->max_ops, seed = 1;
  using Setter = std::function<bool(const char*)>;
  const std::map<std::string, Setter> flags = {
      {"--steps", [&](const char* v) { return ParseInt(v, 1, &o->steps); }},
      {"--seed", [&](const char* v) { return ParseInt(v, 0, &seed); }},
      {"--report-every", [&](const char* v) { return ParseInt(v, 1, &o->report_every); }},
      {"--pool", [&](const char* v) { return ParseInt(v, 16, &pool); }},
      {"--max-ops", [&](const char* v) { return ParseInt(v, 1, &max_ops); }},
      {"--join-chance",
       [&](const char* v) { return ParseDouble(v, 0, &o->join_chance) && o->join_chance <= 1; }},
      {"--added-set-chance",
       [&](const char* v) {
         return ParseDouble(v, 0, &o->added_set_chance) && o->added_set_chance <= 1;
       }},
      {"--unnamed-chance",
       [&](const char* v) {
         return ParseDouble(v, 0, &o->unnamed_chance) && o->unnamed_chance <= 1;
       }},
      {"--repeat-every", [&](const char* v) { return ParseInt(v, 0, &o->repeat_every); }},
      {"--steady-steps", [&](const char* v) { return ParseInt(v, 0, &o->steady_steps); }},
      {"--wait-seconds", [&](const char* v) { return ParseDouble(v, 0.001, &o->wait_seconds); }},
      {"--hang-seconds", [&](const char* v) { return ParseDouble(v, 1, &o->hang_seconds); }},
      {"--rss-bound-mib", [&](const char* v) { return ParseDouble(v, 0, &o->rss_bound_mib); }},
      {"--heap-bound-mib", [&](const char* v) { return ParseDouble(v, 0, &o->heap_bound_mib); }},
      {"--warmup-fraction",
       [&](const char* v) { return ParseDouble(v, 0, &o->warmup) && o->warmup < 1; }},
      {"--window", [&](const char* v) { return ParseInt(v, 1, &o->window); }},
      {"--window-every", [&](const char* v) { return ParseInt(v, 1, &o->window_every); }},
      {"--timeline",
       [&](const char* v) {
         const std::string mode = v;
         if (mode == "whole")
           o->timeline = TimelineMode::kWhole;
         else if (mode == "windows")
           o->timeline = TimelineMode::kWindows;
         else if (mode == "off")
           o->timeline = TimelineMode::kOff;
         else
           return false;
         return true;
       }},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--keep-timeline") {
      o->keep_timeline = true;
      continue;
    }
    if (flag == "--device-tensors") {
      o->device_tensors = true;
      continue;
    }
    if (flag == "--no-memory-bounds") {
      o->memory_bounds = false;
      continue;
    }
    const auto it = flags.find(flag);
    if (it == flags.end()) {
      *error = "unknown flag '" + flag + "'";
      return false;
    }
    if (i + 1 >= argc || !it->second(argv[i + 1])) {
      *error = "bad or missing value for " + flag;
      return false;
    }
    ++i;
  }
  if (o->steady_steps > 0 && o->repeat_every > 0) {
    *error = "--steady-steps and --repeat-every do not go together";
    return false;
  }
  if (o->steady_steps > 0 && o->timeline != TimelineMode::kWhole) {
    *error =
        "--steady-steps needs --timeline whole: the timeline shows whether the steps ran locked";
    return false;
  }
  if (o->window > o->window_every) {
    *error = "--window must not exceed --window-every";
    return false;
  }
  o->seed = static_cast<uint64_t>(seed);
  o->pool = static_cast<int>(pool);
  o->max_ops = static_cast<int>(max_ops);
  if (o->report_every == 0) o->report_every = o->steps >= 10 ? o->steps / 10 : 1;
  if (o->hang_seconds == 0) o->hang_seconds = 2 * o->wait_seconds + 30;
  return true;
}

}  // namespace soak
}  // namespace gradsync
