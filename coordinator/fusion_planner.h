// Fusion planner: groups a cycle's responses into buckets, each run as one collective. Every rank
// plans from the same response list with the same settings, so every rank gets the same buckets.
//
// Pure function; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "coordinator/message.h"

namespace gradsync {

struct FusionSettings {
  int64_t fusion_threshold_bytes = 64ll << 20;  // most bytes one fused bucket packs; 0 = no fusion
  int64_t inplace_threshold_bytes = 256ll << 10;  // tensors this large run alone, in place
};

struct Bucket {
  std::vector<size_t> responses;  // indices into the planned response list, in execution order
};

// Allreduce responses that agree on dtype, device, reduce op and scale factors share a bucket while
// their aligned sizes fit the threshold, and so do reducescatter responses among themselves; a
// reduction of at least the in-place threshold, and every other collective, gets a bucket of its
// own. Buckets are ordered by their first response, so work
// starts in the order the responses were agreed. Error and shutdown responses are not planned.
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
