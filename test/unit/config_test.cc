#include "runtime/config.h"

#include <gtest/gtest.h>

#include <clocale>
#include <map>
#include <string>

namespace gradsync {
namespace {

using Env = std::map<std::string, std::string>;

// Parses `env` through a fake getenv, so the tests never depend on the real environment.
Status Parse(const Env& env, Config* out) {
  return Config::FromEnvironment(out, [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

Config ParseOk(const Env& env) {
  Config config;
  Status status = Parse(env, &config);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return config;
}

// Expects `value` for `name` to be rejected with a message that names the variable and quotes
// the value.
void ExpectRejected(const std::string& name, const std::string& value) {
  Config config;
  config.cache_capacity = 7;  // a sentinel: a failed parse must leave *out untouched
  Status status = Parse({{name, value}}, &config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << name << "=" << value;
  EXPECT_NE(status.message().find(name + "='" + value + "'"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("expected"), std::string::npos) << status.message();
  EXPECT_EQ(config.cache_capacity, 7);
}

TEST(ConfigTest, DefaultsWhenNothingIsSet) {
  Config config = ParseOk({});
  Config defaults;
  EXPECT_EQ(config.fusion_threshold_bytes, 64ll << 20);
  EXPECT_EQ(config.inplace_threshold_bytes, 256ll << 10);
  EXPECT_DOUBLE_EQ(config.cycle_time_ms, 1.0);
  EXPECT_EQ(config.cache_capacity, 1024);
  EXPECT_DOUBLE_EQ(config.stall_warning_seconds, 60.0);
  EXPECT_DOUBLE_EQ(config.stall_shutdown_seconds, 300.0);
  EXPECT_EQ(config.log_level, LogLevel::kWarn);
  EXPECT_EQ(config.ToString(), defaults.ToString());
}

TEST(ConfigTest, EmptyValueKeepsTheDefault) {
  Config config = ParseOk({{"GRADSYNC_FUSION_THRESHOLD", ""},
                           {"GRADSYNC_CYCLE_TIME_MS", ""},
                           {"GRADSYNC_LOG_LEVEL", ""}});
  EXPECT_EQ(config.fusion_threshold_bytes, 64ll << 20);
  EXPECT_DOUBLE_EQ(config.cycle_time_ms, 1.0);
  EXPECT_EQ(config.log_level, LogLevel::kWarn);
}

TEST(ConfigTest, NullGetenvReadsTheProcessEnvironment) {
  Config config;
  EXPECT_TRUE(Config::FromEnvironment(&config).ok());
}

TEST(ConfigTest, NullOutputIsRejected) {
  EXPECT_EQ(Config::FromEnvironment(nullptr, [](const char*) { return nullptr; }).code(),
            StatusCode::kInvalidArgument);
}

TEST(ConfigTest, FusionThresholdAcceptsBytesInRange) {
  EXPECT_EQ(ParseOk({{"GRADSYNC_FUSION_THRESHOLD", "0"}}).fusion_threshold_bytes, 0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_FUSION_THRESHOLD", "33554432"}}).fusion_threshold_bytes,
            32ll << 20);
  EXPECT_EQ(ParseOk({{"GRADSYNC_FUSION_THRESHOLD", "17179869184"}}).fusion_threshold_bytes,
            1ll << 34);
}

TEST(ConfigTest, FusionThresholdRejectsBadValues) {
  for (const char* bad : {"abc", "64M", "1e3", "1.5", "-1", "+5", " 5", "5 ", "0x10", "17179869185",
                          "99999999999999999999999"}) {
    ExpectRejected("GRADSYNC_FUSION_THRESHOLD", bad);
  }
}

TEST(ConfigTest, InplaceThresholdAcceptsBytesInRange) {
  EXPECT_EQ(ParseOk({{"GRADSYNC_INPLACE_THRESHOLD", "0"}}).inplace_threshold_bytes, 0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_INPLACE_THRESHOLD", "4096"}}).inplace_threshold_bytes, 4096);
  EXPECT_EQ(ParseOk({{"GRADSYNC_INPLACE_THRESHOLD", "1099511627776"}}).inplace_threshold_bytes,
            1ll << 40);
}

TEST(ConfigTest, ShmThresholdAcceptsBytesInRangeAndRejectsTheRest) {
  EXPECT_EQ(Config().shm_threshold_bytes, 16ll << 20);
  EXPECT_EQ(ParseOk({{"GRADSYNC_SHM_THRESHOLD", "0"}}).shm_threshold_bytes, 0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_SHM_THRESHOLD", "1048576"}}).shm_threshold_bytes, 1 << 20);
  for (const char* bad : {"on", "1M", "-1", "17179869185"}) {
    ExpectRejected("GRADSYNC_SHM_THRESHOLD", bad);
  }
}

TEST(ConfigTest, InplaceThresholdRejectsBadValues) {
  for (const char* bad : {"x", "12k", "-4096", "1099511627777", "nan"}) {
    ExpectRejected("GRADSYNC_INPLACE_THRESHOLD", bad);
  }
}

TEST(ConfigTest, CycleTimeAcceptsMillisecondsInRange) {
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_CYCLE_TIME_MS", "0.05"}}).cycle_time_ms, 0.05);
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_CYCLE_TIME_MS", "2.5"}}).cycle_time_ms, 2.5);
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_CYCLE_TIME_MS", "5"}}).cycle_time_ms, 5.0);
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_CYCLE_TIME_MS", "1e3"}}).cycle_time_ms, 1000.0);
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_CYCLE_TIME_MS", "10000"}}).cycle_time_ms, 10000.0);
}

TEST(ConfigTest, CycleTimeRejectsBadValues) {
  for (const char* bad : {"abc", "1e3x", "5ms", "0.04", "0", "-1", "10000.5", "nan", "NaN", "inf",
                          "-inf", "infinity", ".", "1..2"}) {
    ExpectRejected("GRADSYNC_CYCLE_TIME_MS", bad);
  }
}

TEST(ConfigTest, CycleTimeMessageNamesTheRange) {
  Config config;
  Status status = Parse({{"GRADSYNC_CYCLE_TIME_MS", "abc"}}, &config);
  EXPECT_EQ(status.message(),
            "GRADSYNC_CYCLE_TIME_MS='abc': expected a number of milliseconds in [0.05, 10000]");
}

TEST(ConfigTest, CacheCapacityAcceptsEntriesInRange) {
  EXPECT_EQ(ParseOk({{"GRADSYNC_CACHE_CAPACITY", "0"}}).cache_capacity, 0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_CACHE_CAPACITY", "64"}}).cache_capacity, 64);
  EXPECT_EQ(ParseOk({{"GRADSYNC_CACHE_CAPACITY", "1048576"}}).cache_capacity, 1 << 20);
}

TEST(ConfigTest, CacheCapacityRejectsBadValues) {
  for (const char* bad : {"lots", "10 ", "-1", "1048577", "1e2"}) {
    ExpectRejected("GRADSYNC_CACHE_CAPACITY", bad);
  }
}

TEST(ConfigTest, LockedScheduleKnobs) {
  const Config defaults = ParseOk({});
  EXPECT_TRUE(defaults.locked_schedule);
  EXPECT_EQ(defaults.lock_after_steps, 3);
  EXPECT_DOUBLE_EQ(defaults.lock_wait_ms, 1000.0);
  EXPECT_FALSE(ParseOk({{"GRADSYNC_LOCKED_SCHEDULE", "off"}}).locked_schedule);
  EXPECT_EQ(defaults.caller_launch, CallerLaunch::kAll);
  EXPECT_EQ(ParseOk({{"GRADSYNC_CALLER_LAUNCH", "0"}}).caller_launch, CallerLaunch::kNone);
  EXPECT_EQ(ParseOk({{"GRADSYNC_CALLER_LAUNCH", "on"}}).caller_launch, CallerLaunch::kAll);
  EXPECT_EQ(ParseOk({{"GRADSYNC_CALLER_LAUNCH", "Single"}}).caller_launch, CallerLaunch::kSingle);
  EXPECT_NE(ParseOk({{"GRADSYNC_CALLER_LAUNCH", "single"}})
                .ToString()
                .find("GRADSYNC_CALLER_LAUNCH=single"),
            std::string::npos);
  ExpectRejected("GRADSYNC_CALLER_LAUNCH", "sometimes");
  EXPECT_TRUE(defaults.device_copy_tables);
  EXPECT_FALSE(ParseOk({{"GRADSYNC_DEVICE_COPY_TABLES", "no"}}).device_copy_tables);
  ExpectRejected("GRADSYNC_DEVICE_COPY_TABLES", "2");
  EXPECT_EQ(ParseOk({{"GRADSYNC_LOCK_AFTER_STEPS", "1"}}).lock_after_steps, 1);
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_LOCK_WAIT_MS", "0.5"}}).lock_wait_ms, 0.5);
  for (const char* bad : {"maybe", "2"}) ExpectRejected("GRADSYNC_LOCKED_SCHEDULE", bad);
  for (const char* bad : {"0", "-1", "three", "1000001"}) {
    ExpectRejected("GRADSYNC_LOCK_AFTER_STEPS", bad);
  }
  for (const char* bad : {"0", "-5", "1s", "10000001"})
    ExpectRejected("GRADSYNC_LOCK_WAIT_MS", bad);
}

TEST(ConfigTest, StallWarningAcceptsPositiveSeconds) {
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_STALL_WARNING_SECONDS", "0.5"}}).stall_warning_seconds, 0.5);
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_STALL_WARNING_SECONDS", "120"}}).stall_warning_seconds,
                   120.0);
}

TEST(ConfigTest, StallWarningRejectsBadValues) {
  for (const char* bad : {"0", "-5", "soon", "30s", "1000001", "nan", "inf"}) {
    ExpectRejected("GRADSYNC_STALL_WARNING_SECONDS", bad);
  }
}

TEST(ConfigTest, StallShutdownAcceptsSecondsAndZeroDisables) {
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_STALL_SHUTDOWN_SECONDS", "600"}}).stall_shutdown_seconds,
                   600.0);
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_STALL_SHUTDOWN_SECONDS", "0"}}).stall_shutdown_seconds, 0.0);
  // 0 disables the shutdown, so it is not held against a larger warning timeout.
  Config config = ParseOk(
      {{"GRADSYNC_STALL_WARNING_SECONDS", "900"}, {"GRADSYNC_STALL_SHUTDOWN_SECONDS", "0"}});
  EXPECT_DOUBLE_EQ(config.stall_shutdown_seconds, 0.0);
}

TEST(ConfigTest, StallShutdownRejectsBadValues) {
  for (const char* bad : {"-1", "never", "1e7", "nan", "5 min"}) {
    ExpectRejected("GRADSYNC_STALL_SHUTDOWN_SECONDS", bad);
  }
}

TEST(ConfigTest, StallShutdownEqualToWarningIsAccepted) {
  Config config = ParseOk(
      {{"GRADSYNC_STALL_WARNING_SECONDS", "30"}, {"GRADSYNC_STALL_SHUTDOWN_SECONDS", "30"}});
  EXPECT_DOUBLE_EQ(config.stall_shutdown_seconds, 30.0);
}

TEST(ConfigTest, StallShutdownBelowWarningIsRejectedNamingBoth) {
  Config config;
  Status status =
      Parse({{"GRADSYNC_STALL_WARNING_SECONDS", "120"}, {"GRADSYNC_STALL_SHUTDOWN_SECONDS", "60"}},
            &config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("GRADSYNC_STALL_SHUTDOWN_SECONDS=60"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("GRADSYNC_STALL_WARNING_SECONDS=120"), std::string::npos)
      << status.message();
}

TEST(ConfigTest, StallShutdownBelowDefaultWarningIsRejected) {
  Config config;
  Status status = Parse({{"GRADSYNC_STALL_SHUTDOWN_SECONDS", "10"}}, &config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("GRADSYNC_STALL_WARNING_SECONDS=60"), std::string::npos)
      << status.message();
}

TEST(ConfigTest, LogLevelNamesAreCaseInsensitive) {
  const std::map<std::string, LogLevel> cases = {
      {"trace", LogLevel::kTrace},  {"DEBUG", LogLevel::kDebug}, {"Info", LogLevel::kInfo},
      {"warning", LogLevel::kWarn}, {"WARN", LogLevel::kWarn},   {"error", LogLevel::kError},
      {"off", LogLevel::kOff},      {"OFF", LogLevel::kOff}};
  for (const auto& [text, level] : cases) {
    EXPECT_EQ(ParseOk({{"GRADSYNC_LOG_LEVEL", text}}).log_level, level) << text;
  }
}

TEST(ConfigTest, LogLevelRejectsUnknownNames) {
  for (const char* bad : {"verbose", "critical", "3", " info", "info "}) {
    ExpectRejected("GRADSYNC_LOG_LEVEL", bad);
  }
}

TEST(ConfigTest, LogLevelNameRoundTrips) {
  for (LogLevel level : {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn,
                         LogLevel::kError, LogLevel::kOff}) {
    EXPECT_EQ(ParseOk({{"GRADSYNC_LOG_LEVEL", LogLevelName(level)}}).log_level, level);
  }
  EXPECT_STREQ(LogLevelName(LogLevel::kWarn), "warning");
}

TEST(ConfigTest, GpuBackendNamesAreCaseInsensitive) {
  EXPECT_EQ(Config().gpu_backend, GpuBackend::kAuto);
  EXPECT_EQ(ParseOk({{"GRADSYNC_GPU_BACKEND", "NCCL"}}).gpu_backend, GpuBackend::kNccl);
  EXPECT_EQ(ParseOk({{"GRADSYNC_GPU_BACKEND", "mpi"}}).gpu_backend, GpuBackend::kMpi);
  EXPECT_EQ(ParseOk({{"GRADSYNC_GPU_BACKEND", "Auto"}}).gpu_backend, GpuBackend::kAuto);
  for (const char* bad : {"gloo", "cuda", "1", " nccl"})
    ExpectRejected("GRADSYNC_GPU_BACKEND", bad);
}

TEST(ConfigTest, HierarchicalAllreduceIsASwitch) {
  EXPECT_FALSE(Config().hierarchical_allreduce);
  for (const char* on : {"1", "true", "YES", "On"}) {
    EXPECT_TRUE(ParseOk({{"GRADSYNC_HIERARCHICAL_ALLREDUCE", on}}).hierarchical_allreduce) << on;
  }
  for (const char* off : {"0", "false", "no", "OFF"}) {
    EXPECT_FALSE(ParseOk({{"GRADSYNC_HIERARCHICAL_ALLREDUCE", off}}).hierarchical_allreduce) << off;
  }
  for (const char* bad : {"2", "enabled", " 1"})
    ExpectRejected("GRADSYNC_HIERARCHICAL_ALLREDUCE", bad);
  EXPECT_NE(ParseOk({{"GRADSYNC_HIERARCHICAL_ALLREDUCE", "1"}})
                .ToString()
                .find("GRADSYNC_HIERARCHICAL_ALLREDUCE=1"),
            std::string::npos);
}

TEST(ConfigTest, CalibrationAndItsPin) {
  const Config defaults = ParseOk({});
  EXPECT_TRUE(defaults.calibrate);
  EXPECT_FALSE(defaults.inplace_threshold_pinned);
  EXPECT_NE(defaults.ToString().find("GRADSYNC_INPLACE_THRESHOLD=262144(until calibrated)"),
            std::string::npos);
  const Config pinned = ParseOk({{"GRADSYNC_INPLACE_THRESHOLD", "262144"}});
  EXPECT_TRUE(pinned.inplace_threshold_pinned);
  EXPECT_FALSE(ParseOk({{"GRADSYNC_CALIBRATE", "0"}}).calibrate);
  ExpectRejected("GRADSYNC_CALIBRATE", "maybe");
  EXPECT_DOUBLE_EQ(defaults.calibration_seconds, 5.0);
  EXPECT_DOUBLE_EQ(ParseOk({{"GRADSYNC_CALIBRATION_SECONDS", "0"}}).calibration_seconds, 0.0);
  const Config patient = ParseOk({{"GRADSYNC_CALIBRATION_SECONDS", "30.5"}});
  EXPECT_DOUBLE_EQ(patient.calibration_seconds, 30.5);
  EXPECT_NE(patient.ToString().find("GRADSYNC_CALIBRATION_SECONDS=30.5"), std::string::npos);
  for (const char* bad : {"-1", "3601", "nan", "5s", ""}) {
    if (*bad != '\0') ExpectRejected("GRADSYNC_CALIBRATION_SECONDS", bad);
  }
  EXPECT_FALSE(defaults.autotune);
  EXPECT_EQ(defaults.autotune_log, "gradsync-autotune.csv");
  const Config tuned = ParseOk({{"GRADSYNC_AUTOTUNE", "1"}, {"GRADSYNC_AUTOTUNE_LOG", "t.csv"}});
  EXPECT_TRUE(tuned.autotune);
  EXPECT_EQ(tuned.autotune_log, "t.csv");
  EXPECT_NE(tuned.ToString().find("GRADSYNC_AUTOTUNE=1 (t.csv)"), std::string::npos);
  ExpectRejected("GRADSYNC_AUTOTUNE", "auto");
  EXPECT_EQ(defaults.pipeline_chunk_bytes, 0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_PIPELINE_CHUNK_BYTES", "0"}}).pipeline_chunk_bytes, 0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_PIPELINE_CHUNK_BYTES", "4096"}}).pipeline_chunk_bytes, 4096);
  for (const char* bad : {"100", "-64", "2147483648", "4k"}) {
    ExpectRejected("GRADSYNC_PIPELINE_CHUNK_BYTES", bad);
  }
}

TEST(ConfigTest, AllreducePiecesAreCalibratedUnlessSet) {
  const Config defaults = ParseOk({});
  EXPECT_EQ(defaults.allreduce_piece_bytes, 0);
  EXPECT_FALSE(defaults.allreduce_piece_pinned);
  EXPECT_NE(defaults.ToString().find("GRADSYNC_ALLREDUCE_PIECE_BYTES=(calibrated)"),
            std::string::npos);
  const Config whole = ParseOk({{"GRADSYNC_ALLREDUCE_PIECE_BYTES", "0"}});
  EXPECT_TRUE(whole.allreduce_piece_pinned);
  EXPECT_EQ(whole.allreduce_piece_bytes, 0);
  EXPECT_NE(whole.ToString().find("GRADSYNC_ALLREDUCE_PIECE_BYTES=0"), std::string::npos);
  const Config pinned = ParseOk({{"GRADSYNC_ALLREDUCE_PIECE_BYTES", "1048576"}});
  EXPECT_TRUE(pinned.allreduce_piece_pinned);
  EXPECT_EQ(pinned.allreduce_piece_bytes, 1 << 20);
  EXPECT_EQ(ParseOk({{"GRADSYNC_ALLREDUCE_PIECE_BYTES", "1073741824"}}).allreduce_piece_bytes,
            1 << 30);
  // Without calibration nothing chooses: unset means whole.
  const Config uncalibrated = ParseOk({{"GRADSYNC_CALIBRATE", "0"}});
  EXPECT_NE(uncalibrated.ToString().find("GRADSYNC_ALLREDUCE_PIECE_BYTES=0"), std::string::npos);
  for (const char* bad : {"100", "-64", "1073741888", "1M", " 64"}) {
    ExpectRejected("GRADSYNC_ALLREDUCE_PIECE_BYTES", bad);
  }
}

TEST(ConfigTest, PlacementVariables) {
  const Config defaults = ParseOk({});
  EXPECT_EQ(defaults.gpu_device, -1);
  EXPECT_EQ(defaults.thread_affinity, "");
  EXPECT_FALSE(defaults.bind_process);
  EXPECT_EQ(ParseOk({{"GRADSYNC_GPU_DEVICE", "0"}}).gpu_device, 0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_GPU_DEVICE", "7"}}).gpu_device, 7);
  for (const char* bad : {"-1", "1024", "gpu0", "1.5"}) ExpectRejected("GRADSYNC_GPU_DEVICE", bad);
  EXPECT_TRUE(ParseOk({{"GRADSYNC_BIND_PROCESS", "yes"}}).bind_process);
  ExpectRejected("GRADSYNC_BIND_PROCESS", "numa");
  for (const char* good : {"none", "0,1", "0-1;2-3", "3"}) {
    EXPECT_EQ(ParseOk({{"GRADSYNC_THREAD_AFFINITY", good}}).thread_affinity, good);
  }
  for (const char* bad : {"auto", "0,,1", "3-1", "-1", "0;x"}) {
    ExpectRejected("GRADSYNC_THREAD_AFFINITY", bad);
  }
}

TEST(ConfigTest, NcclTimeoutAcceptsSecondsAndZeroDisables) {
  EXPECT_EQ(Config().nccl_timeout_seconds, 600.0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_NCCL_TIMEOUT_SECONDS", "0"}}).nccl_timeout_seconds, 0.0);
  EXPECT_EQ(ParseOk({{"GRADSYNC_NCCL_TIMEOUT_SECONDS", "0.25"}}).nccl_timeout_seconds, 0.25);
  for (const char* bad : {"-1", "nan", "inf", "10s"}) {
    ExpectRejected("GRADSYNC_NCCL_TIMEOUT_SECONDS", bad);
  }
}

TEST(ConfigTest, ToStringListsEveryKnob) {
  Config config = ParseOk({{"GRADSYNC_FUSION_THRESHOLD", "1024"},
                           {"GRADSYNC_INPLACE_THRESHOLD", "0"},
                           {"GRADSYNC_ALLREDUCE_PIECE_BYTES", "4096"},
                           {"GRADSYNC_SHM_THRESHOLD", "0"},
                           {"GRADSYNC_CALLER_REDUCE", "off"},
                           {"GRADSYNC_CALIBRATION_SECONDS", "12.5"},
                           {"GRADSYNC_HIERARCHICAL_ALLREDUCE", "yes"},
                           {"GRADSYNC_CYCLE_TIME_MS", "0.05"},
                           {"GRADSYNC_LOCKED_SCHEDULE", "no"},
                           {"GRADSYNC_LOCK_AFTER_STEPS", "7"},
                           {"GRADSYNC_CALLER_LAUNCH", "off"},
                           {"GRADSYNC_LOCK_WAIT_MS", "250"},
                           {"GRADSYNC_CACHE_CAPACITY", "0"},
                           {"GRADSYNC_STALL_WARNING_SECONDS", "1.5"},
                           {"GRADSYNC_STALL_SHUTDOWN_SECONDS", "1000000"},
                           {"GRADSYNC_LOG_LEVEL", "debug"},
                           {"GRADSYNC_DEVICE_COPY_TABLES", "off"},
                           {"GRADSYNC_GPU_BACKEND", "MPI"},
                           {"GRADSYNC_NCCL_TIMEOUT_SECONDS", "2.5"},
                           {"GRADSYNC_GPU_DEVICE", "3"},
                           {"GRADSYNC_THREAD_AFFINITY", "4,5"},
                           {"GRADSYNC_BIND_PROCESS", "1"},
                           {"GRADSYNC_TIMELINE", "trace.json"}});
  EXPECT_EQ(
      config.ToString(),
      "GRADSYNC_FUSION_THRESHOLD=1024 GRADSYNC_INPLACE_THRESHOLD=0 GRADSYNC_CALIBRATE=1 "
      "GRADSYNC_CALIBRATION_SECONDS=12.5 "
      "GRADSYNC_CALLER_REDUCE=0 GRADSYNC_PIPELINE_CHUNK_BYTES=0 "
      "GRADSYNC_ALLREDUCE_PIECE_BYTES=4096 GRADSYNC_AUTOTUNE=0 GRADSYNC_SHM_THRESHOLD=0 "
      "GRADSYNC_HIERARCHICAL_ALLREDUCE=1 GRADSYNC_LOCKED_SCHEDULE=0 GRADSYNC_LOCK_AFTER_STEPS=7 "
      "GRADSYNC_CALLER_LAUNCH=0 GRADSYNC_LOCK_WAIT_MS=250 GRADSYNC_CYCLE_TIME_MS=0.05 "
      "GRADSYNC_CACHE_CAPACITY=0 "
      "GRADSYNC_STALL_WARNING_SECONDS=1.5 GRADSYNC_STALL_SHUTDOWN_SECONDS=1000000 "
      "GRADSYNC_LOG_LEVEL=debug GRADSYNC_DEVICE_COPY_TABLES=0 GRADSYNC_GPU_BACKEND=mpi "
      "GRADSYNC_NCCL_TIMEOUT_SECONDS=2.5 "
      "GRADSYNC_GPU_DEVICE=3 GRADSYNC_THREAD_AFFINITY=4,5 GRADSYNC_BIND_PROCESS=1 "
      "GRADSYNC_TIMELINE=trace.json");
  EXPECT_NE(Config().ToString().find("GRADSYNC_TIMELINE=(off)"), std::string::npos);
}

TEST(ConfigTest, FirstBadVariableIsReportedAndNothingIsApplied) {
  Config config;
  config.fusion_threshold_bytes = 5;
  Status status =
      Parse({{"GRADSYNC_FUSION_THRESHOLD", "1"}, {"GRADSYNC_CACHE_CAPACITY", "-3"}}, &config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("GRADSYNC_CACHE_CAPACITY"), std::string::npos);
  EXPECT_EQ(config.fusion_threshold_bytes, 5);
}

// Names and switches in upper case parse as in lower case under whatever locale the process runs
// (a Turkish LC_CTYPE, which Python sets from the environment, lowercases 'I' to no ASCII letter),
// where one is installed.
TEST(ConfigTest, UpperCaseNamesParseUnderATurkishLocale) {
  const std::string before = std::setlocale(LC_CTYPE, nullptr);
  if (std::setlocale(LC_CTYPE, "tr_TR.UTF-8") == nullptr &&
      std::setlocale(LC_CTYPE, "tr_TR.ISO-8859-9") == nullptr) {
    GTEST_SKIP() << "no Turkish locale installed";
  }
  const Config config = ParseOk({{"GRADSYNC_GPU_BACKEND", "MPI"},
                                 {"GRADSYNC_LOG_LEVEL", "INFO"},
                                 {"GRADSYNC_CALIBRATE", "OFF"}});
  std::setlocale(LC_CTYPE, before.c_str());
  EXPECT_EQ(config.gpu_backend, GpuBackend::kMpi);
  EXPECT_EQ(config.log_level, LogLevel::kInfo);
  EXPECT_FALSE(config.calibrate);
}

}  // namespace
}  // namespace gradsync
