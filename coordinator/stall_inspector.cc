#include "coordinator/stall_inspector.h"

#include <algorithm>
#include <cstdio>

#include "runtime/logging.h"

namespace gradsync {

namespace {

constexpr size_t kMaxTensorsDescribed = 10;

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

}  // namespace

std::string DescribeStalled(const std::vector<ReadinessTable::Waiting>& waiting, double now,
                            double min_wait) {
  std::string out;
  size_t described = 0, stalled = 0;
  for (const auto& w : waiting) {
    if (now - w.first_seen < min_wait) continue;
    ++stalled;
    if (described == kMaxTensorsDescribed) continue;
    ++described;
    if (!out.empty()) out += "; ";
    out += "tensor '" + w.name + "' waited " + Seconds(now - w.first_seen) + ", missing on rank" +
           (w.missing_ranks.size() == 1 ? " " : "s ") + RankListString(w.missing_ranks) +
           " (ready on " + RankListString(w.ready_ranks) + ")";
  }
  if (stalled > described) out += "; and " + std::to_string(stalled - described) + " more";
  return out;
}

StallInspector::StallInspector(double warning_seconds, double shutdown_seconds, int32_t set_id)
    : warning_seconds_(warning_seconds), shutdown_seconds_(shutdown_seconds), set_id_(set_id) {}

double StallInspector::inspection_interval() const {
  // Often enough that a shutdown fires close to its deadline, rarely enough to cost nothing.
  double interval = std::min(1.0, warning_seconds_ / 4);
  if (shutdown_seconds_ > 0) interval = std::min(interval, shutdown_seconds_ / 4);
  return interval;
}

bool StallInspector::InspectionDue(const ReadinessTable& table, double now) const {
  return !table.empty() && now - last_inspection_ >= inspection_interval();
}

Status StallInspector::Inspect(const ReadinessTable& table, double now, std::string* warning) {
  last_inspection_ = now;
  if (warning != nullptr) warning->clear();
  const auto waiting = table.WaitingNames();
  if (waiting.empty()) {
    last_warned_.clear();
    return Status::OK();
  }
  const double oldest_wait = now - waiting.front().first_seen;
  if (shutdown_seconds_ > 0 && oldest_wait >= shutdown_seconds_) {
    // Every tensor past the warning time is named, not only those past the shutdown time: they
    // all fail now, and tensors submitted a few cycles after the first are as stuck as it.
    const std::string set = "process set " + std::to_string(set_id_);
    return Status::Stalled(
        (set_id_ == 0 ? std::string() : set + ": ") + "stalled for more than " +
        Seconds(shutdown_seconds_) +
        " (GRADSYNC_STALL_SHUTDOWN_SECONDS); some ranks never submitted these collectives: " +
        DescribeStalled(waiting, now, std::min(warning_seconds_, shutdown_seconds_)) +
        (set_id_ == 0 ? ". Every pending operation is failed and gradsync shuts down instead of "
                        "hanging."
                      : ". Every pending operation of " + set +
                            " is failed and the set is closed instead of hanging; the other sets "
                            "go on."));
  }
  // Remember when each still-waiting name was last reported; names that completed are forgotten.
  std::unordered_map<std::string, double> last_warned;
  bool warn = false;
  for (const auto& w : waiting) {
    auto it = last_warned_.find(w.name);
    double last = it == last_warned_.end() ? -1e300 : it->second;
    if (now - w.first_seen >= warning_seconds_ && now - last >= warning_seconds_) {
      last = now;
      warn = true;
    }
    if (last > -1e300) last_warned.emplace(w.name, last);
  }
  last_warned_ = std::move(last_warned);
  if (warn) {
    const std::string text =
        (set_id_ == 0 ? std::string() : "process set " + std::to_string(set_id_) + ": ") +
        "stall: ranks are waiting on collectives that other ranks have not submitted for more "
        "than " +
        Seconds(warning_seconds_) + ": " + DescribeStalled(waiting, now, warning_seconds_);
    Log().warn("{}", text);
    if (warning != nullptr) *warning = text;
  }
  return Status::OK();
}

}  // namespace gradsync
