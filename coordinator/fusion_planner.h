// Fusion planner: groups a cycle's responses into buckets, each run as one collective. Every rank
// plans from the same response list with the same settings, so every rank gets the same buckets.
//
// Pure function; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "coordinator/message.h"
#include "runtime/config.h"

namespace gradsync {

// Device tensors' buckets unless GRADSYNC_FUSION_THRESHOLD or GRADSYNC_INPLACE_THRESHOLD pins
// them: PyTorch DDP's 25 MiB, every smaller tensor fused. On a GPU a bucket's copies in and out
// cost far less than launching one more collective and its completion, which a tensor reduced
// alone pays; one launch per large tensor is what made host launches, not reductions, the limit
// of a ResNet-50 backward on an H200.
constexpr int64_t kDeviceBucketBytes = 25ll << 20;

struct FusionSettings {
  int64_t fusion_threshold_bytes = 64ll << 20;  // most bytes one fused bucket packs; 0 = no fusion
  int64_t inplace_threshold_bytes = 256ll << 10;  // tensors this large run alone, in place
  // The same two for device tensors. Calibration and the autotuner, which time the host plane,
  // tune only the host's.
  int64_t device_fusion_threshold_bytes = kDeviceBucketBytes;
  int64_t device_inplace_threshold_bytes = kDeviceBucketBytes;

  // The defaults above, with what GRADSYNC_FUSION_THRESHOLD and GRADSYNC_INPLACE_THRESHOLD set
  // (pinned: for host and device tensors alike).
  static FusionSettings From(const Config& config);
};

struct Bucket {
  std::vector<size_t> responses;  // indices into the planned response list, in execution order
};

// Allreduce responses that agree on dtype, device, reduce op and scale factors share a bucket while
// their aligned sizes fit the threshold, and so do reducescatter responses among themselves; a
// reduction of at least the in-place threshold, and every other collective, gets a bucket of its
// own. Device tensors' responses use the device thresholds. Buckets are ordered by their first
// response, so work starts in the order the responses were agreed. Error and shutdown responses are
// not planned.
//
// `consecutive` plans a locked step (coordinator/locked_schedule.h), whose buckets start in plan
// order as each fills: a bucket then holds only responses that follow one another, and any response
// that cannot join the open bucket closes it. Fused by class instead, a step's small tensors would
// share one bucket from the first to the last, and every bucket after it would wait for the end of
// the step.
std::vector<Bucket> PlanFusion(const std::vector<const Response*>& responses,
                               const FusionSettings& settings, bool consecutive = false);

// Bytes of one response's tensor (0 for types without data).
int64_t ResponseBytes(const Response& response);

}  // namespace gradsync
