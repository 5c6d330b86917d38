#include "runtime/query_pacer.h"

#include <algorithm>

namespace gradsync {
namespace {

constexpr int kGapDivisor = 16;  // the gap's part of the wait so far
constexpr std::chrono::nanoseconds kLongestGap(std::chrono::milliseconds(1));

}  // namespace

void QueryPacer::Looked(Clock::time_point now) {
  const std::chrono::nanoseconds waited = now - since_;
  next_ = now + std::clamp(waited / kGapDivisor, std::min(shortest_gap_, kLongestGap), kLongestGap);
}

}  // namespace gradsync
