// Calibration of the MPI plane's host allreduce: what reducing tensors alone in place and in
// fused buckets costs on this communicator, for the cost model the fusion planner plans from
// (coordinator/cost_model.h).
//
// Thread safety: Calibrate runs on the background thread, as every collective of the plane.
#pragma once

#include <cstdint>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

// One measurement: `tensors` tensors of `bytes` in all took `us` microseconds (the slowest
// rank's median over the repetitions).
struct CostSample {
  double bytes = 0;
  int tensors = 1;
  double us = 0;
};

// One allreduce of a probe buffer issued in pieces of `piece_bytes` (0: whole) took `us`.
struct PieceSample {
  int64_t piece_bytes = 0;
  double us = 0;
};
// The probe: larger than a core's cache, as a large layer's gradient is, so that the whole
// allreduce goes through memory while pieces of a suitable size stay in the cache.
constexpr int64_t kPieceProbeBytes = int64_t{32} << 20;
// The piece sizes tried besides the whole probe.
constexpr int64_t kPieceCandidates[] = {512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20};

struct AllreduceCalibration {
  std::vector<CostSample> in_place;  // one tensor per allreduce, reduced where it lies
  std::vector<CostSample> fused;     // buckets of several tensors, through the plane's fused path
  // When the hierarchical path was compared: the same buckets through it and through the flat
  // path (`fused` is then the flat one).
  std::vector<CostSample> fused_hierarchical;
  double seconds = 0;         // how long calibrating took
  double budget_seconds = 0;  // the time it was given: the smallest any rank gave
  int sizes_skipped = 0;      // of the ladder's largest, left out to stay within the time budget
};

}  // namespace gradsync
