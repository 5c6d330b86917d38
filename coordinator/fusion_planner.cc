#include "coordinator/fusion_planner.h"

#include "runtime/fusion_buffer.h"

namespace gradsync {

namespace {

bool Fusible(const Response& a, const Response& b) {
  return a.type == b.type && a.dtype == b.dtype && a.device == b.device &&
         a.reduce_op == b.reduce_op && a.prescale == b.prescale && a.postscale == b.postscale;
}

bool Planned(const Response& r) {
  return r.type != ResponseType::kError && r.type != ResponseType::kStallShutdown;
}

}  // namespace

FusionSettings FusionSettings::From(const Config& config) {
  FusionSettings settings;
  settings.fusion_threshold_bytes = config.fusion_threshold_bytes;
  settings.inplace_threshold_bytes = config.inplace_threshold_bytes;
  if (config.fusion_threshold_pinned) {
    settings.device_fusion_threshold_bytes = config.fusion_threshold_bytes;
    settings.device_inplace_threshold_bytes = config.fusion_threshold_bytes;
  }
  if (config.inplace_threshold_pinned) {
    settings.device_inplace_threshold_bytes = config.inplace_threshold_bytes;
  }
  return settings;
}

int64_t ResponseBytes(const Response& response) {
  if (response.type == ResponseType::kBarrier) return 0;
  int64_t n = 1;
  for (int64_t d : response.shape) n *= d;
  return n * static_cast<int64_t>(DataTypeSize(response.dtype));
}

std::vector<Bucket> PlanFusion(const std::vector<const Response*>& responses,
                               const FusionSettings& settings, bool consecutive) {
  struct Open {
    size_t bucket;
    const Response* first;  // the bucket's first response, which the others must be fusible with
    int64_t bytes;          // aligned end offset of the packed bucket
  };
  std::vector<Bucket> buckets;
  std::vector<Open> open;  // buckets still accepting tensors, at most one per fusible class
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& r = *responses[i];
    if (!Planned(r)) continue;
    const int64_t bytes = ResponseBytes(r);
    const bool reduction =
        r.type == ResponseType::kAllreduce || r.type == ResponseType::kReducescatter;
    const bool on_device = r.device.kind != DeviceKind::kCpu;
    const int64_t cap =
        on_device ? settings.device_fusion_threshold_bytes : settings.fusion_threshold_bytes;
    const int64_t inplace =
        on_device ? settings.device_inplace_threshold_bytes : settings.inplace_threshold_bytes;
    const bool alone = !reduction || bytes >= inplace || bytes > cap;
    if (alone) {
      buckets.push_back({{i}});
      if (consecutive) open.clear();
      continue;
    }
    const int64_t aligned = static_cast<int64_t>(AlignFusionOffset(static_cast<size_t>(bytes)));
    Open* slot = nullptr;
    for (Open& o : open) {
      if (Fusible(*o.first, r)) slot = &o;
    }
    if (slot != nullptr && slot->bytes + aligned <= cap) {
      buckets[slot->bucket].responses.push_back(i);
      slot->bytes += aligned;
      continue;
    }
    buckets.push_back({{i}});
    if (consecutive) open.clear();
    if (slot != nullptr && !consecutive) {
      *slot = {buckets.size() - 1, &r, aligned};
    } else {
      open.push_back({buckets.size() - 1, &r, aligned});
    }
  }
  return buckets;
}

}  // namespace gradsync
