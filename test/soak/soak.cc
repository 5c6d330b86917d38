// gradsync_soak: a long randomized run under `mpirun -np 4`. Every step runs a random set of
// collectives (every kind, dtype and reduce op, grouped or not, on the global set and on process
// sets, occasionally a join or an added and removed set), checks every result exactly, and the
// run watches resident memory, descriptors and threads for growth and writes a timeline that must
// come out complete. Pass/fail is collective: any failure on any rank fails every rank, and no
// wait is unbounded (a watchdog aborts the job if a blocking call never returns).
//
//   mpirun -np 4 gradsync_soak --steps 10000 --seed 1 --report-every 500
//
// docs/soak.md describes the flags, what a step covers and the last long run.
#include <gradsync/gradsync.h>
#include <mpi.h>
#include <stdlib.h>  // mkdtemp, setenv

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/device/device_plane_factory.h"
#include "ops/device/producer_readiness.h"
#include "runtime/host_stream.h"
#include "test/host_stream_readiness.h"
#include "test/soak/soak_options.h"
#include "test/soak/soak_plan.h"
#include "test/soak/soak_probe.h"
#include "test/soak/soak_report.h"
#include "test/soak/soak_run.h"

namespace gradsync {
namespace soak {
namespace {

// Process sets created at init: overlapping, of two and three ranks, each kept where the world
// has its ranks and it is not the whole world.
std::vector<std::vector<int>> InitSets(int size) {
  std::vector<std::vector<int>> sets;
  for (const std::vector<int>& s : {std::vector<int>{0, 1}, {1, 2, 3}, {0, 2}}) {
    if (s.back() < size && static_cast<int>(s.size()) < size) sets.push_back(s);
  }
  return sets;
}

std::string BroadcastString(std::string value) {
  int length = static_cast<int>(value.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  value.resize(static_cast<size_t>(length));
  MPI_Bcast(value.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return value;
}

// Rank 0 makes a fresh directory for the timeline; every rank learns its name.
std::string MakeTimelineDir(int rank) {
  std::string dir;
  if (rank == 0) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/gradsync_soak.XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) dir = pattern;
  }
  return BroadcastString(dir);
}

// What ran, so that a log can be replayed: the flags that shape the plans and the knobs.
void PrintHeader(const Options& options, int size, const std::vector<std::vector<int>>& sets) {
  std::string text = "soak: " + std::to_string(size) + " ranks, " + std::to_string(options.steps) +
                     " steps, seed " + std::to_string(options.seed) + ", pool " +
                     std::to_string(options.pool) + ", max ops " + std::to_string(options.max_ops);
  if (options.repeat_every > 0)
    text += ", plans repeat every " + std::to_string(options.repeat_every);
  if (options.steady_steps > 0)
    text += ", steady stretches of " + std::to_string(options.steady_steps) + " steps";
  if (options.device_tensors) text += ", device tensors over the host backend";
  text += ", init sets";
  for (const std::vector<int>& s : sets) {
    text += " {";
    for (size_t i = 0; i < s.size(); ++i) text += (i ? "," : "") + std::to_string(s[i]);
    text += "}";
  }
  for (const char* knob :
       {"GRADSYNC_FUSION_THRESHOLD", "GRADSYNC_INPLACE_THRESHOLD", "GRADSYNC_SHM_THRESHOLD",
        "GRADSYNC_CACHE_CAPACITY", "GRADSYNC_CYCLE_TIME_MS", "GRADSYNC_STALL_SHUTDOWN_SECONDS",
        "GRADSYNC_LOCK_AFTER_STEPS", "GRADSYNC_LOCK_WAIT_MS"}) {
    if (const char* v = std::getenv(knob)) text += std::string(", ") + knob + "=" + v;
  }
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

int Run(const Options& options, int rank, int size) {
  Report report(rank, size, options);
  Watchdog watchdog(options.hang_seconds);
  const std::vector<std::vector<int>> init_sets =
      options.steady_steps > 0 ? std::vector<std::vector<int>>() : InitSets(size);

  // The timeline: the whole run into one file (GRADSYNC_TIMELINE, as a user would set it), or
  // windows of steps, each started and stopped at run time, checked, and deleted.
  std::string timeline_dir, timeline_file;
  if (options.timeline != TimelineMode::kOff) {
    timeline_dir = MakeTimelineDir(rank);
    if (timeline_dir.empty()) {
      report.Fail("could not create a directory for the timeline");
    } else if (options.timeline == TimelineMode::kWhole) {
      timeline_file = timeline_dir + "/timeline.json";
      setenv("GRADSYNC_TIMELINE", timeline_file.c_str(), 1);
    }
  }

  if (options.device_tensors) {
    SetDevicePlaneFactoryForTesting(&MakeHostBackedDevicePlane);
    // --device-tensors: a producer stream is the StepRunner's HostStream.
    SetReadinessRecorderForTesting(&testing::RecordOnHostStream);
  }
  InitOptions init_options;
  init_options.process_sets = init_sets;
  watchdog.Enter("init", -1);
  try {
    init(init_options);
  } catch (const Error& e) {
    report.Fail(std::string("init() threw ") + e.what());
    watchdog.Leave();
    return report.Finish(nullptr, {}, timeline_dir, options.keep_timeline);
  }
  if (rank == 0) PrintHeader(options, size, init_sets);
  std::vector<std::vector<int>> set_lists{std::vector<int>()};
  for (int r = 0; r < size; ++r) set_lists[0].push_back(r);
  set_lists.insert(set_lists.end(), init_sets.begin(), init_sets.end());
  PlannerConfig config;
  config.seed = options.seed;
  config.pool_size = options.pool;
  config.max_ops = options.max_ops;
  config.join_chance = options.join_chance;
  config.added_set_chance = options.added_set_chance;
  config.unnamed_chance = options.unnamed_chance;
  config.steady_steps = static_cast<int>(options.steady_steps);
  const Planner planner(config, set_lists);
  StepRunner runner(planner, process_sets(), options.seed,
                    std::chrono::milliseconds(static_cast<int64_t>(options.wait_seconds * 1000)),
                    options.device_tensors);
  Failures failures(rank, 20);
  Tally tally;

  report.Sample(0);
  // The verdict of step s travels (non-blocking) while step s + 1 runs, so ranks may drift by a
  // step, and a failure anywhere stops every rank within two steps.
  int sent[3] = {0, -1, 1}, agreed[3] = {0, 0, 0};
  MPI_Request verdict = MPI_REQUEST_NULL;
  int64_t step = 0;
  for (; step < options.steps; ++step) {
    if (options.timeline == TimelineMode::kWindows && step % options.window_every == 0) {
      report.StartWindow(timeline_dir, step);
    }
    StepPlan plan = planner.MakeStep(options.repeat_every ? step % options.repeat_every : step);
    plan.step = step;
    watchdog.Enter(plan.join ? "a join step" : "a step", step);
    const int last = runner.Run(plan, &tally, &failures);
    watchdog.Enter("the verdict of the previous step", step);
    if (verdict != MPI_REQUEST_NULL) MPI_Wait(&verdict, MPI_STATUS_IGNORE);
    if (step > 0 && agreed[1] != -agreed[2]) {
      report.Fail("step " + std::to_string(step - 1) + ": join() returned different ranks");
    }
    if (agreed[0] != 0) break;
    sent[0] = failures.count() > 0 || report.failed() ? 1 : 0;
    sent[1] = last;
    sent[2] = -last;
    MPI_Iallreduce(sent, agreed, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &verdict);
    if (options.timeline == TimelineMode::kWindows &&
        (step % options.window_every == options.window - 1 || step + 1 == options.steps)) {
      report.StopWindow();
    }
    if ((step + 1) % options.report_every == 0 || step + 1 == options.steps) {
      watchdog.Enter("sampling", step);
      report.Sample(step + 1, &tally);
    }
  }
  watchdog.Enter("the last verdict", step);
  if (verdict != MPI_REQUEST_NULL) MPI_Wait(&verdict, MPI_STATUS_IGNORE);
  if (agreed[0] != 0 && failures.count() == 0) report.Fail("another rank failed");
  watchdog.Enter("shutdown", step);
  try {
    shutdown();
  } catch (const Error& e) {
    report.Fail(std::string("shutdown() threw ") + e.what());
  }
  SetDevicePlaneFactoryForTesting(nullptr);
  SetReadinessRecorderForTesting(nullptr);
  watchdog.Leave();
  if (failures.count() > 0) report.Fail(std::to_string(failures.count()) + " failed checks");
  return report.Finish(&tally, timeline_file, timeline_dir, options.keep_timeline);
}

}  // namespace
}  // namespace soak
}  // namespace gradsync

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  gradsync::soak::Options options;
  std::string error;
  int result = 2;
  if (!gradsync::soak::ParseOptions(argc, argv, &options, &error)) {
    if (rank == 0)
      std::fprintf(stderr, "gradsync_soak: %s\n%s", error.c_str(), gradsync::soak::kUsage);
  } else {
    result = gradsync::soak::Run(options, rank, size);
  }
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
