// Logging: one spdlog logger per process, every line prefixed with the rank.
//
// Thread safety: InitLogging is called by init() before any other thread exists; Log() may be
// called from any thread afterwards (spdlog's multi-threaded sink).
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "runtime/config.h"

namespace gradsync {

// (Re)creates the process logger with "[gradsync rank N]" in every line.
void InitLogging(int rank, LogLevel level);
// The process logger; before InitLogging, a default one at warning level.
spdlog::logger& Log();

// "0, 2, 3": ranks as messages list them.
std::string RankListString(const std::vector<int>& ranks);

}  // namespace gradsync
