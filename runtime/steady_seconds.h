// SteadySeconds: the monotonic clock as seconds in a double, the unit of the coordinator's
// injectable clocks (negotiation rounds, the locked schedule's waits, caller lanes' watchdog), so
// tests can drive them with plain numbers.
//
// Thread safety: safe from any thread.
#pragma once

#include <chrono>

namespace gradsync {

inline double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace gradsync
