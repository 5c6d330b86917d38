// StallInspector: rank 0's watch over tensors that some ranks have submitted and others have not.
// After the warning time it logs which tensors wait and which ranks are missing them (again every
// warning period while they wait); after the shutdown time it returns the error that fails every
// pending operation on every rank, instead of letting the job hang.
//
// Owned and used by rank 0's background thread only.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "coordinator/readiness_table.h"
#include "gradsync/status.h"

namespace gradsync {

class StallInspector {
 public:
  // shutdown_seconds == 0 disables the shutdown. `set_id` names a process set other than the
  // global one in the messages, whose stall closes that set alone.
  StallInspector(double warning_seconds, double shutdown_seconds, int32_t set_id = 0);

  // True when rank 0 should ask for a full negotiation round so Inspect can run: the table has
  // waiting names and the last inspection is older than the inspection interval.
  bool InspectionDue(const ReadinessTable& table, double now) const;
  // Logs stall warnings (and returns the text in *warning when given; empty when none was due);
  // returns a Stalled status naming every stalled tensor and its missing ranks once the oldest has
  // waited past the shutdown time, OK otherwise.
  Status Inspect(const ReadinessTable& table, double now, std::string* warning = nullptr);

  double inspection_interval() const;

 private:
  double warning_seconds_;
  double shutdown_seconds_;
  int32_t set_id_;
  double last_inspection_ = -1e300;
  std::unordered_map<std::string, double> last_warned_;
};

// "tensor 'a' waited 12.0 s, missing on ranks 1, 3 (ready on 0, 2)" for each name waiting at least
// `min_wait`, oldest first, capped at ten names.
std::string DescribeStalled(const std::vector<ReadinessTable::Waiting>& waiting, double now,
                            double min_wait);

}  // namespace gradsync
