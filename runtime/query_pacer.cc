#include "runtime/query_pacer.h"

#include <algorithm>

namespace gradsync {
namespace {

constexpr int kGapDivisor = 16;  // the gap's part of the wait so far
constexpr std::chrono::nanoseconds kShortestGap(500);
constexpr std::chrono::nanoseconds kLongestGap(std::chrono::milliseconds(1));

}  // namespace

void QueryPacer::Looked(Clock::time_point now) {
  const std::chrono::nanoseconds waited = now - since_;
  next_ = now + std::clamp(waited / kGapDivisor, kShortestGap, kLongestGap);
}

}  // namespace gradsync
