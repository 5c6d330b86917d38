// Config: every GRADSYNC_* knob, read from the environment in this one place and validated.
//
// Thread safety: Config is a value. Parse once (init), then share read-only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// Which backend reduces device tensors.
enum class GpuBackend {
  kAuto,  // NCCL when this build has it, else MPI
  kNccl,  // NCCL collectives on the communication stream
  kMpi,   // staged through pinned host buffers (or device memory, when MPI is CUDA-aware)
};

// Which locked device buckets the caller's thread launches (GRADSYNC_CALLER_LAUNCH).
enum class CallerLaunch {
  kNone,    // 0: the background thread launches every bucket
  kSingle,  // single: buckets of one tensor; the background thread the rest
  kAll,     // 1: every bucket
};

struct Config {
  // GRADSYNC_FUSION_THRESHOLD: bytes of one fusion buffer; 0 disables fusion.
  int64_t fusion_threshold_bytes = 64ll << 20;
  // The smallest last-level cache of the ranks' nodes in bytes, set by init() from the topology
  // (not a variable); 0 when unknown. Calibration keeps fused buckets within half of it.
  int64_t cache_bytes = 0;
  // GRADSYNC_INPLACE_THRESHOLD: a tensor at least this large is reduced on its own, in place,
  // rather than copied into a fusion buffer (copies cost as much as the reduction in host memory).
  int64_t inplace_threshold_bytes = 256ll << 10;
  // Whether GRADSYNC_FUSION_THRESHOLD and GRADSYNC_INPLACE_THRESHOLD were set: calibration leaves
  // a set value as it is.
  bool fusion_threshold_pinned = false;
  bool inplace_threshold_pinned = false;
  // GRADSYNC_CALIBRATE: at each process set's first host allreduce, measure what reducing alone
  // and fused costs there and plan from it (coordinator/cost_model.h).
  bool calibrate = true;
  // GRADSYNC_CALIBRATION_SECONDS: how long calibration's ladder of bucket sizes may take on the
  // slowest rank. Every operation of the process set waits for it, and a slow network or
  // oversubscribed cores stretch the ladder from under a second to minutes, so a size whose
  // projected time would overrun this is left out, with those above it; with fewer than three
  // sizes timed the set plans with the configured settings. A projection, not a bound: on cores
  // shared with other work one size can take far longer than the one before predicted. Where
  // ranks differ, the smallest applies.
  double calibration_seconds = 5.0;
  // GRADSYNC_CALLER_REDUCE: after its first step, an AllreduceBatch's last bucket is reduced by the
  // caller's own thread in wait(), with no negotiation (runtime/caller_lanes.h). Off on any rank,
  // it is off on every rank.
  bool caller_reduce = true;
  // GRADSYNC_SHM_THRESHOLD: a fused allreduce bucket up to this size goes through memory shared by
  // the ranks when they all run on one node (2 to 64 ranks); 0 sends every bucket through MPI.
  int64_t shm_threshold_bytes = 16ll << 20;
  // GRADSYNC_HIERARCHICAL_ALLREDUCE: host-memory allreduces of a process set that spans hosts
  // reduce within each host, then across hosts, then spread back within the host. Unset,
  // calibration decides from which bucket size (pinned: always, or never).
  bool hierarchical_allreduce = false;
  bool hierarchical_allreduce_pinned = false;
  // GRADSYNC_AUTOTUNE: refine the calibrated settings from the step times of the first steps
  // (coordinator/autotuner.h); GRADSYNC_AUTOTUNE_LOG: where rank 0 writes the trajectory.
  bool autotune = false;
  std::string autotune_log = "gradsync-autotune.csv";
  // GRADSYNC_PIPELINE_CHUNK_BYTES: fused buckets through MPI messages of two chunks or more are
  // reduced chunk by chunk, copies overlapping reductions; 0 (the default: measured slower across
  // hosts, docs/benchmarks.md) reduces them whole.
  int64_t pipeline_chunk_bytes = 0;
  // GRADSYNC_ALLREDUCE_PIECE_BYTES: blocking MPI allreduces of host memory are issued in pieces of
  // at most this many bytes (0: whole). Unset, calibration chooses (whole without calibration).
  int64_t allreduce_piece_bytes = 0;
  bool allreduce_piece_pinned = false;
  // GRADSYNC_LOCKED_SCHEDULE: a process set whose negotiation gives the same step
  // GRADSYNC_LOCK_AFTER_STEPS times in a row locks that step's plan and launches its buckets with
  // no negotiation (coordinator/locked_schedule.h). Off on any rank, no set locks.
  bool locked_schedule = true;
  int64_t lock_after_steps = 3;
  // GRADSYNC_CALLER_LAUNCH: while the schedule is locked, the thread that enqueues a device
  // tensor completing a bucket runs the loop's cycle itself, launching the bucket without handing
  // it to the background thread (docs/architecture.md, "Launching from the caller's thread"):
  // every bucket (1), none (0), or only a bucket of one tensor (`single`), whose launch has no
  // batched copies to pay for on the caller's thread.
  CallerLaunch caller_launch = CallerLaunch::kAll;
  // GRADSYNC_LOCK_WAIT_MS: how long a locked rank waits for a bucket that does not fill, or for
  // the others to reach one, before it asks every rank to leave the lock.
  double lock_wait_ms = 1000.0;
  // GRADSYNC_CYCLE_TIME_MS: the longest the background thread sleeps between cycles when idle.
  double cycle_time_ms = 1.0;
  // GRADSYNC_CACHE_CAPACITY: response cache entries; 0 disables the cache.
  int64_t cache_capacity = 1024;
  // GRADSYNC_STALL_WARNING_SECONDS: log the stalled tensors and missing ranks after this long.
  double stall_warning_seconds = 60.0;
  // GRADSYNC_STALL_SHUTDOWN_SECONDS: fail every pending operation after this long; 0 disables.
  double stall_shutdown_seconds = 300.0;
  // GRADSYNC_LOG_LEVEL: trace, debug, info, warning, error, off.
  LogLevel log_level = LogLevel::kWarn;
  // GRADSYNC_DEVICE_COPY_TABLES: a device batched copy that repeats (a locked bucket's, step
  // after step) keeps its descriptors in device memory and passes the kernel their address
  // (ops/device/copy_table_cache.h); off, every launch passes them anew.
  bool device_copy_tables = true;
  // GRADSYNC_GPU_BACKEND: auto, nccl or mpi.
  GpuBackend gpu_backend = GpuBackend::kAuto;
  // GRADSYNC_NCCL_TIMEOUT_SECONDS: launched device work that has not finished after this long
  // aborts its process set's device plane and fails; 0 disables.
  double nccl_timeout_seconds = 600.0;
  // GRADSYNC_GPU_DEVICE: the visible GPU this rank uses; -1 (unset) picks local rank modulo the
  // number of visible GPUs. init() sets it to the GPU it chose.
  int gpu_device = -1;
  // GRADSYNC_THREAD_AFFINITY: where the background thread runs (runtime/placement.h): empty for
  // near this rank's GPU or NUMA node, "none" for unbound, or CPUs per local rank.
  std::string thread_affinity;
  // GRADSYNC_BIND_PROCESS: bind the whole process near its GPU or NUMA node, unless the launcher
  // bound it already.
  bool bind_process = false;
  // GRADSYNC_TIMELINE: file rank 0 writes a Chrome trace / Perfetto timeline to; empty = off.
  std::string timeline_path;

  using Getenv = std::function<const char*(const char*)>;
  // Reads every variable through `getenv` (std::getenv by default). An unset or empty variable
  // keeps its default; a bad value is an InvalidArgument naming the variable and the accepted
  // range.
  static Status FromEnvironment(Config* out, const Getenv& getenv = nullptr);

  // One line, "NAME=value" pairs, for the startup debug log.
  std::string ToString() const;

  // The settings that decide which collectives a process set runs, and so must be the same on
  // every rank (the buckets, calibration and tuning, pipelining, the response cache, the device
  // backend), each as its variable and its value as an integer. init() checks them.
  std::vector<std::pair<const char*, int64_t>> SharedSettings() const;
  // How long a rank waits in a round (negotiated or locked) for a peer's background thread before
  // it gives up on it as stuck: the stall shutdown time, but no less than the device completion
  // timeout, up to which that thread may be held by its own device work (a process set's close
  // drains its buckets). 0: never.
  double PeerThreadGiveUpSeconds() const;
};

const char* LogLevelName(LogLevel level);
const char* GpuBackendName(GpuBackend backend);

}  // namespace gradsync
