#include "runtime/config.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <system_error>

#include "runtime/placement.h"

namespace gradsync {
namespace {

struct LevelName {
  const char* name;
  LogLevel level;
};
// "warn" is accepted as an alias because spdlog and many launchers spell it that way.
constexpr std::array<LevelName, 7> kLevelNames = {{{"trace", LogLevel::kTrace},
                                                   {"debug", LogLevel::kDebug},
                                                   {"info", LogLevel::kInfo},
                                                   {"warning", LogLevel::kWarn},
                                                   {"warn", LogLevel::kWarn},
                                                   {"error", LogLevel::kError},
                                                   {"off", LogLevel::kOff}}};

// Shortest fixed-point text that reads back as the same double, so messages and ToString show
// "0.05" and "1000000", not "0.050000" or "1e+06".
std::string FormatDouble(double value) {
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
  if (result.ec != std::errc()) result = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, result.ptr);
}

Status BadValue(const char* name, std::string_view text, const std::string& expected) {
  return Status::InvalidArgument(std::string(name) + "='" + std::string(text) + "': expected " +
                                 expected);
}

struct IntegerSpec {
  const char* name;
  int64_t max;
  const char* unit;
  const char* note;  // appended to the accepted range, e.g. what 0 means

  std::string Describe() const {
    return std::string("a whole number of ") + unit + " in [0, " + std::to_string(max) + "]" + note;
  }
};

struct RealSpec {
  const char* name;
  double min;
  bool min_exclusive;
  double max;
  const char* unit;
  const char* note;

  std::string Describe() const {
    return std::string("a number of ") + unit + " in " + (min_exclusive ? "(" : "[") +
           FormatDouble(min) + ", " + FormatDouble(max) + "]" + note;
  }
  bool Contains(double v) const { return (min_exclusive ? v > min : v >= min) && v <= max; }
};

const IntegerSpec kFusionThreshold{"GRADSYNC_FUSION_THRESHOLD", int64_t{1} << 34, "bytes",
                                   " (0 disables fusion)"};
const IntegerSpec kInplaceThreshold{"GRADSYNC_INPLACE_THRESHOLD", int64_t{1} << 40, "bytes",
                                    " (0 reduces every tensor in place on its own)"};
const IntegerSpec kShmThreshold{"GRADSYNC_SHM_THRESHOLD", int64_t{1} << 34, "bytes",
                                " (0 disables the shared-memory path)"};
const IntegerSpec kCacheCapacity{"GRADSYNC_CACHE_CAPACITY", int64_t{1} << 20, "entries",
                                 " (0 disables the response cache)"};
const IntegerSpec kGpuDevice{"GRADSYNC_GPU_DEVICE", 1023, "visible devices",
                             " (unset: the local rank modulo the visible GPUs)"};
const IntegerSpec kPipelineChunk{"GRADSYNC_PIPELINE_CHUNK_BYTES", int64_t{1} << 30, "bytes",
                                 " (a multiple of 64; 0 reduces buckets whole)"};
const IntegerSpec kAllreducePiece{"GRADSYNC_ALLREDUCE_PIECE_BYTES", int64_t{1} << 30, "bytes",
                                  " (a multiple of 64; 0 reduces whole)"};
const IntegerSpec kLockAfterSteps{"GRADSYNC_LOCK_AFTER_STEPS", 1000000, "steps", " (at least 1)"};
const RealSpec kLockWait{"GRADSYNC_LOCK_WAIT_MS", 0.0, true, 1e7, "milliseconds", ""};
const RealSpec kCycleTime{"GRADSYNC_CYCLE_TIME_MS", 0.05, false, 10000.0, "milliseconds", ""};
const RealSpec kStallWarning{"GRADSYNC_STALL_WARNING_SECONDS", 0.0, true, 1e6, "seconds", ""};
const RealSpec kStallShutdown{
    "GRADSYNC_STALL_SHUTDOWN_SECONDS", 0.0, false, 1e6, "seconds", " (0 disables)"};
const RealSpec kCalibrationSeconds{"GRADSYNC_CALIBRATION_SECONDS",
                                   0.0,
                                   false,
                                   3600.0,
                                   "seconds",
                                   " (0 times one size: too few to plan from)"};
const RealSpec kNcclTimeout{
    "GRADSYNC_NCCL_TIMEOUT_SECONDS", 0.0, false, 1e6, "seconds", " (0 disables)"};

// Accepts only ASCII digits: from_chars alone would take a leading '-', and strtoll would also
// take whitespace, '+' and trailing junk.
Status ParseInteger(const IntegerSpec& spec, std::string_view text, int64_t* out) {
  int64_t value = 0;
  auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!std::isdigit(static_cast<unsigned char>(text.front())) || result.ec != std::errc() ||
      result.ptr != text.data() + text.size() || value > spec.max) {
    return BadValue(spec.name, text, spec.Describe());
  }
  *out = value;
  return Status::OK();
}

// from_chars accepts "nan", "inf" and "infinity", which are never a sensible duration.
Status ParseReal(const RealSpec& spec, std::string_view text, double* out) {
  double value = 0;
  auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec != std::errc() || result.ptr != text.data() + text.size() ||
      !std::isfinite(value) || !spec.Contains(value)) {
    return BadValue(spec.name, text, spec.Describe());
  }
  *out = value;
  return Status::OK();
}

// Names and switches are case-insensitive, in ASCII whatever the process's locale: under a
// Turkish LC_CTYPE (which Python sets from the environment) std::tolower leaves 'I' as it is.
std::string Lowercase(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return lower;
}

Status ParseLogLevel(const char* name, std::string_view text, LogLevel* out) {
  const std::string lower = Lowercase(text);
  for (const LevelName& entry : kLevelNames) {
    if (lower == entry.name) {
      *out = entry.level;
      return Status::OK();
    }
  }
  return BadValue(name, text, "one of trace, debug, info, warning (or warn), error, off");
}

Status ParseGpuBackend(const char* name, std::string_view text, GpuBackend* out) {
  const std::string lower = Lowercase(text);
  for (GpuBackend backend : {GpuBackend::kAuto, GpuBackend::kNccl, GpuBackend::kMpi}) {
    if (lower == GpuBackendName(backend)) {
      *out = backend;
      return Status::OK();
    }
  }
  return BadValue(name, text, "one of auto, nccl, mpi");
}

// Horovod's switches take 1 and 0; the words are what users also try.
Status ParseSwitch(const char* name, std::string_view text, bool* out) {
  const std::string lower = Lowercase(text);
  for (const char* yes : {"1", "true", "yes", "on"}) {
    if (lower == yes) {
      *out = true;
      return Status::OK();
    }
  }
  for (const char* no : {"0", "false", "no", "off"}) {
    if (lower == no) {
      *out = false;
      return Status::OK();
    }
  }
  return BadValue(name, text, "1 or 0 (also true/false, yes/no, on/off)");
}

// A switch, or `single` between its two ends.
Status ParseCallerLaunch(std::string_view text, CallerLaunch* out) {
  const std::string lower = Lowercase(text);
  if (lower == "single") {
    *out = CallerLaunch::kSingle;
    return Status::OK();
  }
  bool on = true;
  if (!ParseSwitch("GRADSYNC_CALLER_LAUNCH", text, &on).ok()) {
    return BadValue("GRADSYNC_CALLER_LAUNCH", text,
                    "1, 0 or single (also true/false, yes/no, on/off)");
  }
  *out = on ? CallerLaunch::kAll : CallerLaunch::kNone;
  return Status::OK();
}

const char* CallerLaunchName(CallerLaunch launch) {
  switch (launch) {
    case CallerLaunch::kNone:
      return "0";
    case CallerLaunch::kSingle:
      return "single";
    case CallerLaunch::kAll:
      break;
  }
  return "1";
}

// Treats an empty variable like an unset one: `export GRADSYNC_X=` is a common way to clear it.
std::string_view Lookup(const Config::Getenv& getenv, const char* name) {
  const char* value = getenv ? getenv(name) : std::getenv(name);
  return value ? std::string_view(value) : std::string_view();
}

Status CheckStallOrder(const Config& config) {
  if (config.stall_shutdown_seconds == 0 ||
      config.stall_shutdown_seconds >= config.stall_warning_seconds) {
    return Status::OK();
  }
  return Status::InvalidArgument(
      "GRADSYNC_STALL_SHUTDOWN_SECONDS=" + FormatDouble(config.stall_shutdown_seconds) +
      " is less than GRADSYNC_STALL_WARNING_SECONDS=" + FormatDouble(config.stall_warning_seconds) +
      ": the shutdown timeout must be at least the warning timeout, or 0 to disable it");
}

Status ParseVar(const Config::Getenv& getenv, const IntegerSpec& spec, int64_t* out) {
  std::string_view text = Lookup(getenv, spec.name);
  return text.empty() ? Status::OK() : ParseInteger(spec, text, out);
}

Status ParseVar(const Config::Getenv& getenv, const RealSpec& spec, double* out) {
  std::string_view text = Lookup(getenv, spec.name);
  return text.empty() ? Status::OK() : ParseReal(spec, text, out);
}

Status ParseLogLevelVar(const Config::Getenv& getenv, const char* name, LogLevel* out) {
  std::string_view text = Lookup(getenv, name);
  return text.empty() ? Status::OK() : ParseLogLevel(name, text, out);
}

}  // namespace

std::vector<std::pair<const char*, int64_t>> Config::SharedSettings() const {
  // Unpinned thresholds are calibrated alike on every rank: only a value set is compared.
  return {{kFusionThreshold.name, fusion_threshold_pinned ? fusion_threshold_bytes : -1},
          {kInplaceThreshold.name, inplace_threshold_pinned ? inplace_threshold_bytes : -1},
          {kPipelineChunk.name, pipeline_chunk_bytes},
          {"GRADSYNC_CALIBRATE", calibrate ? 1 : 0},
          {"GRADSYNC_AUTOTUNE", autotune ? 1 : 0},
          {"GRADSYNC_CACHE_CAPACITY", cache_capacity},
          {"GRADSYNC_GPU_BACKEND", static_cast<int64_t>(gpu_backend)},
          // A rank that locks a step before another would poll the locked exchange while the
          // other waits in a negotiation round.
          {kLockAfterSteps.name, lock_after_steps},
          // Set or not decides whether calibration asks the hierarchy question, a collective.
          {"GRADSYNC_HIERARCHICAL_ALLREDUCE",
           hierarchical_allreduce_pinned ? (hierarchical_allreduce ? 1 : 0) : -1}};
}

double Config::PeerThreadGiveUpSeconds() const {
  if (stall_shutdown_seconds == 0) return 0;
  return std::max(stall_shutdown_seconds, nccl_timeout_seconds);
}

// Parses into a copy so that a bad variable leaves *out untouched.
Status Config::FromEnvironment(Config* out, const Getenv& getenv) {
  if (out == nullptr) return Status::InvalidArgument("Config::FromEnvironment: out is null");
  Config c;
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kFusionThreshold, &c.fusion_threshold_bytes));
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kInplaceThreshold, &c.inplace_threshold_bytes));
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kPipelineChunk, &c.pipeline_chunk_bytes));
  if (c.pipeline_chunk_bytes % 64 != 0) {
    return BadValue(kPipelineChunk.name, Lookup(getenv, kPipelineChunk.name),
                    kPipelineChunk.Describe());
  }
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kAllreducePiece, &c.allreduce_piece_bytes));
  if (c.allreduce_piece_bytes % 64 != 0) {
    return BadValue(kAllreducePiece.name, Lookup(getenv, kAllreducePiece.name),
                    kAllreducePiece.Describe());
  }
  c.allreduce_piece_pinned = !Lookup(getenv, kAllreducePiece.name).empty();
  c.fusion_threshold_pinned = !Lookup(getenv, kFusionThreshold.name).empty();
  c.inplace_threshold_pinned = !Lookup(getenv, kInplaceThreshold.name).empty();
  if (std::string_view text = Lookup(getenv, "GRADSYNC_AUTOTUNE"); !text.empty()) {
    GRADSYNC_RETURN_IF_ERROR(ParseSwitch("GRADSYNC_AUTOTUNE", text, &c.autotune));
  }
  if (std::string_view text = Lookup(getenv, "GRADSYNC_AUTOTUNE_LOG"); !text.empty()) {
    c.autotune_log = std::string(text);
  }
  if (std::string_view text = Lookup(getenv, "GRADSYNC_CALIBRATE"); !text.empty()) {
    GRADSYNC_RETURN_IF_ERROR(ParseSwitch("GRADSYNC_CALIBRATE", text, &c.calibrate));
  }
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kCalibrationSeconds, &c.calibration_seconds));
  if (std::string_view text = Lookup(getenv, "GRADSYNC_CALLER_REDUCE"); !text.empty()) {
    GRADSYNC_RETURN_IF_ERROR(ParseSwitch("GRADSYNC_CALLER_REDUCE", text, &c.caller_reduce));
  }
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kShmThreshold, &c.shm_threshold_bytes));
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kCycleTime, &c.cycle_time_ms));
  if (std::string_view text = Lookup(getenv, "GRADSYNC_LOCKED_SCHEDULE"); !text.empty()) {
    GRADSYNC_RETURN_IF_ERROR(ParseSwitch("GRADSYNC_LOCKED_SCHEDULE", text, &c.locked_schedule));
  }
  if (std::string_view text = Lookup(getenv, "GRADSYNC_CALLER_LAUNCH"); !text.empty()) {
    GRADSYNC_RETURN_IF_ERROR(ParseCallerLaunch(text, &c.caller_launch));
  }
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kLockAfterSteps, &c.lock_after_steps));
  if (c.lock_after_steps < 1) {
    return BadValue(kLockAfterSteps.name, Lookup(getenv, kLockAfterSteps.name),
                    kLockAfterSteps.Describe());
  }
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kLockWait, &c.lock_wait_ms));
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kCacheCapacity, &c.cache_capacity));
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kStallWarning, &c.stall_warning_seconds));
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kStallShutdown, &c.stall_shutdown_seconds));
  GRADSYNC_RETURN_IF_ERROR(CheckStallOrder(c));
  GRADSYNC_RETURN_IF_ERROR(ParseLogLevelVar(getenv, "GRADSYNC_LOG_LEVEL", &c.log_level));
  GRADSYNC_RETURN_IF_ERROR(ParseVar(getenv, kNcclTimeout, &c.nccl_timeout_seconds));
  if (std::string_view text = Lookup(getenv, "GRADSYNC_DEVICE_COPY_TABLES"); !text.empty()) {
    GRADSYNC_RETURN_IF_ERROR(
        ParseSwitch("GRADSYNC_DEVICE_COPY_TABLES", text, &c.device_copy_tables));
  }
  if (std::string_view backend = Lookup(getenv, "GRADSYNC_GPU_BACKEND"); !backend.empty()) {
    GRADSYNC_RETURN_IF_ERROR(ParseGpuBackend("GRADSYNC_GPU_BACKEND", backend, &c.gpu_backend));
  }
  if (std::string_view text = Lookup(getenv, "GRADSYNC_HIERARCHICAL_ALLREDUCE"); !text.empty()) {
    GRADSYNC_RETURN_IF_ERROR(
        ParseSwitch("GRADSYNC_HIERARCHICAL_ALLREDUCE", text, &c.hierarchical_allreduce));
    c.hierarchical_allreduce_pinned = true;
  }
  if (std::string_view text = Lookup(getenv, "GRADSYNC_BIND_PROCESS"); !text.empty()) {
    GRADSYNC_RETURN_IF_ERROR(ParseSwitch("GRADSYNC_BIND_PROCESS", text, &c.bind_process));
  }
  if (std::string_view text = Lookup(getenv, kGpuDevice.name); !text.empty()) {
    int64_t device = 0;
    GRADSYNC_RETURN_IF_ERROR(ParseInteger(kGpuDevice, text, &device));
    c.gpu_device = static_cast<int>(device);
  }
  c.thread_affinity = std::string(Lookup(getenv, "GRADSYNC_THREAD_AFFINITY"));
  PlacementRequest request;
  GRADSYNC_RETURN_IF_ERROR(
      ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", c.thread_affinity, &request));
  c.timeline_path = std::string(Lookup(getenv, "GRADSYNC_TIMELINE"));
  *out = c;
  return Status::OK();
}

std::string Config::ToString() const {
  return "GRADSYNC_FUSION_THRESHOLD=" + std::to_string(fusion_threshold_bytes) +
         (fusion_threshold_pinned || !calibrate ? "" : "(at most; calibrated)") +
         " GRADSYNC_INPLACE_THRESHOLD=" + std::to_string(inplace_threshold_bytes) +
         (inplace_threshold_pinned || !calibrate ? "" : "(until calibrated)") +
         " GRADSYNC_CALIBRATE=" + (calibrate ? "1" : "0") +
         " GRADSYNC_CALIBRATION_SECONDS=" + FormatDouble(calibration_seconds) +
         " GRADSYNC_CALLER_REDUCE=" + (caller_reduce ? "1" : "0") +
         " GRADSYNC_PIPELINE_CHUNK_BYTES=" + std::to_string(pipeline_chunk_bytes) +
         " GRADSYNC_ALLREDUCE_PIECE_BYTES=" +
         (allreduce_piece_pinned || !calibrate ? std::to_string(allreduce_piece_bytes)
                                               : "(calibrated)") +
         " GRADSYNC_AUTOTUNE=" + (autotune ? "1 (" + autotune_log + ")" : "0") +
         " GRADSYNC_SHM_THRESHOLD=" + std::to_string(shm_threshold_bytes) +
         " GRADSYNC_HIERARCHICAL_ALLREDUCE=" +
         (hierarchical_allreduce_pinned || !calibrate ? (hierarchical_allreduce ? "1" : "0")
                                                      : "(calibrated)") +
         " GRADSYNC_LOCKED_SCHEDULE=" + (locked_schedule ? "1" : "0") +
         " GRADSYNC_LOCK_AFTER_STEPS=" + std::to_string(lock_after_steps) +
         " GRADSYNC_CALLER_LAUNCH=" + CallerLaunchName(caller_launch) +
         " GRADSYNC_LOCK_WAIT_MS=" + FormatDouble(lock_wait_ms) +
         " GRADSYNC_CYCLE_TIME_MS=" + FormatDouble(cycle_time_ms) +
         " GRADSYNC_CACHE_CAPACITY=" + std::to_string(cache_capacity) +
         " GRADSYNC_STALL_WARNING_SECONDS=" + FormatDouble(stall_warning_seconds) +
         " GRADSYNC_STALL_SHUTDOWN_SECONDS=" + FormatDouble(stall_shutdown_seconds) +
         " GRADSYNC_LOG_LEVEL=" + LogLevelName(log_level) +
         " GRADSYNC_DEVICE_COPY_TABLES=" + (device_copy_tables ? "1" : "0") +
         " GRADSYNC_GPU_BACKEND=" + GpuBackendName(gpu_backend) +
         " GRADSYNC_NCCL_TIMEOUT_SECONDS=" + FormatDouble(nccl_timeout_seconds) +
         " GRADSYNC_GPU_DEVICE=" +
         (gpu_device < 0 ? "(by local rank)" : std::to_string(gpu_device)) +
         " GRADSYNC_THREAD_AFFINITY=" + (thread_affinity.empty() ? "(auto)" : thread_affinity) +
         " GRADSYNC_BIND_PROCESS=" + (bind_process ? "1" : "0") +
         " GRADSYNC_TIMELINE=" + (timeline_path.empty() ? "(off)" : timeline_path);
}

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "trace";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "unknown";
}

const char* GpuBackendName(GpuBackend backend) {
  switch (backend) {
    case GpuBackend::kAuto:
      return "auto";
    case GpuBackend::kNccl:
      return "nccl";
    case GpuBackend::kMpi:
      return "mpi";
  }
  return "unknown";
}

}  // namespace gradsync
