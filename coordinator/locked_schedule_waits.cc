// LockedSchedule's side of a wait for the other ranks (coordinator/locked_schedule.h): the
// nudges, the warning and the give-up that name who is not there, and the tensors a bucket lacks.
#include <string>
#include <vector>

#include "coordinator/locked_schedule.h"
#include "runtime/logging.h"

namespace gradsync {

std::string LockedSchedule::Milliseconds(double seconds) {
  return std::to_string(static_cast<int64_t>(seconds * 1e3 + 0.5)) + " ms";
}

Status LockedSchedule::WhileWaiting(double now) {
  const double waited = now - started_at_;
  if (now >= next_nudge_) {
    GRADSYNC_RETURN_IF_ERROR(channel_->Nudge(exchanges_));
    next_nudge_ = now + settings_.wait_seconds;
  }
  // A live peer releases within two waits of the first nudge; one that has not by the stall
  // shutdown time after those has a background thread that does not run.
  const bool give_up = settings_.stall_shutdown_seconds > 0 &&
                       waited >= settings_.stall_shutdown_seconds + 2 * settings_.wait_seconds;
  if (!give_up && now < next_warning_) return Status::OK();
  const std::string what = "process set " + std::to_string(set_id_) + ": locked bucket " +
                           std::to_string(cursor_) + " has waited " + Milliseconds(waited) +
                           " for the other ranks to reach it" + NotArrivedText();
  if (give_up) {
    return Status::Stalled(what +
                           " (GRADSYNC_STALL_SHUTDOWN_SECONDS); a rank's background "
                           "thread is not running");
  }
  Log().warn("{}", what);
  next_warning_ = now + std::max(settings_.stall_warning_seconds, 2 * settings_.wait_seconds);
  return Status::OK();
}

std::string LockedSchedule::NotArrivedText() {
  // The nudges of the ranks that wait with this one say who is there.
  uint64_t nudged = 0;
  if (!channel_->TakeNudges(&nudged).ok()) return "";
  nudged_ = std::max(nudged_, nudged);
  const std::vector<int> ranks = channel_->NotArrived(exchanges_);
  if (ranks.empty()) return "";
  return std::string(ranks.size() == 1 ? " (not there: rank " : " (not there: ranks ") +
         RankListString(ranks) + ")";
}

std::string LockedSchedule::MissingNames(const PlannedBucket& bucket) const {
  std::string names;
  size_t listed = 0;
  for (size_t i = 0; i < bucket.slots.size(); ++i) {
    if (bucket.slots[i] != nullptr || bucket.done[i]) continue;
    if (listed++ == 3) {
      names += ", ...";
      break;
    }
    names += (names.empty() ? "'" : ", '") + bucket.responses[i]->name + "'";
  }
  return names;
}

}  // namespace gradsync
