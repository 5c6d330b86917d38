#include "runtime/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
#include <string>

namespace gradsync {
namespace {

std::string Pattern(const std::string& rank) {
  return "[gradsync %Y-%m-%d %H:%M:%S.%e rank " + rank + " %l] %v";
}

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::warn;
}

// One logger for the life of the process, reconfigured in place by InitLogging, so a reference
// from Log() held by any thread stays valid across init/shutdown/init. It is deliberately never
// destroyed: threads may still log while static destructors run at exit. It is kept out of
// spdlog's registry so that the application's own spdlog setup can neither collide with it nor
// reconfigure it.
spdlog::logger& ProcessLogger() {
  static spdlog::logger* const logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto* created = new spdlog::logger("gradsync", std::move(sink));
    created->set_pattern(Pattern("?"));
    created->set_level(spdlog::level::warn);
    return created;
  }();
  return *logger;
}

}  // namespace

// set_pattern and set_level are safe while other threads log: the level is atomic and the
// multi-threaded sink swaps its formatter under its own mutex.
void InitLogging(int rank, LogLevel level) {
  spdlog::logger& logger = ProcessLogger();
  logger.set_pattern(Pattern(rank >= 0 ? std::to_string(rank) : "?"));
  logger.set_level(ToSpdlog(level));
}

spdlog::logger& Log() { return ProcessLogger(); }

std::string RankListString(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace gradsync
