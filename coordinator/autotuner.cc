#include "coordinator/autotuner.h"

#include <algorithm>
#include <cstdio>

#include "coordinator/cost_model.h"

namespace gradsync {
namespace {

constexpr int64_t kMinBucket = 1 << 20;

}  // namespace

Autotuner::Autotuner(const TunableSettings& start, int64_t max_fusion, const TunedParameters& tuned)
    : start_(start),
      candidate_(start),
      best_(start),
      max_fusion_(std::max<int64_t>(max_fusion, 1)) {
  if (tuned.inplace_threshold) order_.push_back("inplace_threshold");
  if (tuned.fusion_threshold) order_.push_back("fusion_threshold");
  if (tuned.cycle_time) order_.push_back("cycle_time");
}

std::string Autotuner::Header() {
  return "window,parameter,inplace_threshold_bytes,fusion_threshold_bytes,cycle_time_ms,step_ms,"
         "best";
}

// The other values of the current parameter, around the best so far: a quarter, four times, and
// one extreme (never alone; the largest bucket; the shortest cycle).
void Autotuner::PlanParameter() {
  pending_.clear();
  while (parameter_ < order_.size() && pending_.empty()) {
    const std::string name = order_[parameter_];
    std::vector<TunableSettings> values;
    TunableSettings s = best_;
    if (name == "inplace_threshold") {
      const int64_t at = best_.inplace_threshold_bytes;
      // From "never alone", a quarter of it means nothing: try medium and large tensors alone.
      const std::vector<int64_t> tries =
          at >= kNeverInPlace
              ? std::vector<int64_t>{256 << 10, 4 << 20}
              : std::vector<int64_t>{std::max(kSmallestInPlace, at / 4),
                                     std::min(kNeverInPlace, at * 4), kNeverInPlace};
      for (int64_t v : tries) {
        s.inplace_threshold_bytes = v;
        values.push_back(s);
      }
    } else if (name == "fusion_threshold") {
      const int64_t at = best_.fusion_threshold_bytes;
      // Below 1 MiB a bucket saves too little to try, unless the largest allowed is smaller.
      const int64_t quarter = std::min(max_fusion_, std::max(kMinBucket, at / 4));
      for (int64_t v : {quarter, std::min(max_fusion_, at * 4), max_fusion_}) {
        s.fusion_threshold_bytes = v;
        values.push_back(s);
      }
    } else {
      const double at = best_.cycle_time_ms;
      for (double v : {std::max(0.1, at / 4), std::min(20.0, at * 4), 0.1}) {
        s.cycle_time_ms = v;
        values.push_back(s);
      }
    }
    for (const TunableSettings& v : values) {
      const bool seen =
          v == best_ || std::find(pending_.begin(), pending_.end(), v) != pending_.end();
      if (!seen) pending_.push_back(v);
    }
    if (pending_.empty()) ++parameter_;  // nothing new to try here
  }
}

std::string Autotuner::Record(double window_seconds) {
  const double step_ms = window_seconds * 1e3 / kStepsPerWindow;
  const TunableSettings measured = candidate_;
  const char* parameter = !measured_start_ ? "start" : order_[parameter_];
  bool is_best = false;
  if (!measured_start_ || window_seconds < best_seconds_) {
    best_ = measured;
    best_seconds_ = window_seconds;
    is_best = true;
  }
  if (!measured_start_) {
    measured_start_ = true;
    PlanParameter();
  } else if (pending_.empty()) {
    ++parameter_;
    PlanParameter();
  }
  char line[256];
  std::snprintf(line, sizeof(line), "%d,%s,%lld,%lld,%g,%.3f,%s", window_, parameter,
                static_cast<long long>(measured.inplace_threshold_bytes),
                static_cast<long long>(measured.fusion_threshold_bytes), measured.cycle_time_ms,
                step_ms, is_best ? "yes" : "no");
  ++window_;
  if (pending_.empty() && parameter_ >= order_.size()) {
    done_ = true;
  } else {
    candidate_ = pending_.front();
    pending_.erase(pending_.begin());
  }
  return line;
}

}  // namespace gradsync
