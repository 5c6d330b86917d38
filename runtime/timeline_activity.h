// TimelineActivity: marks one activity (a copy, a collective) on the timeline rows of the entries
// it covers, from construction to destruction. When the timeline is off (every rank but rank 0, or
// no GRADSYNC_TIMELINE) it costs one atomic load and records nothing.
//
// Thread safety: as Timeline's recording calls.
#pragma once

#include <string_view>
#include <vector>

#include "runtime/tensor_entry.h"
#include "runtime/timeline.h"

namespace gradsync {

class TimelineActivity {
 public:
  TimelineActivity(Timeline* timeline, const std::vector<TensorEntry*>& entries,
                   std::string_view activity)
      : TimelineActivity(timeline, entries.data(), entries.size(), activity) {}
  TimelineActivity(Timeline* timeline, TensorEntry* entry, std::string_view activity)
      : single_(entry) {
    Begin(timeline, &single_, 1, activity);
  }
  ~TimelineActivity() {
    if (timeline_ == nullptr) return;
    for (size_t i = 0; i < count_; ++i) timeline_->ActivityEnd(entries_[i]->name);
  }
  TimelineActivity(const TimelineActivity&) = delete;
  TimelineActivity& operator=(const TimelineActivity&) = delete;

 private:
  TimelineActivity(Timeline* timeline, TensorEntry* const* entries, size_t count,
                   std::string_view activity) {
    Begin(timeline, entries, count, activity);
  }
  void Begin(Timeline* timeline, TensorEntry* const* entries, size_t count,
             std::string_view activity) {
    if (timeline == nullptr || !timeline->active()) return;
    timeline_ = timeline;
    entries_ = entries;
    count_ = count;
    for (size_t i = 0; i < count_; ++i) timeline_->ActivityStart(entries_[i]->name, activity);
  }

  Timeline* timeline_ = nullptr;
  TensorEntry* const* entries_ = nullptr;
  size_t count_ = 0;
  TensorEntry* single_ = nullptr;
};

}  // namespace gradsync
