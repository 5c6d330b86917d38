// Device events in a build without CUDA: no CUDA handle can be taken.
#include <chrono>

#include "ops/device/device_events.h"

namespace gradsync {

Status ImportReadiness(void* cuda_event, void* cuda_stream, int,
                       std::shared_ptr<StreamEvent>* ready) {
  *ready = nullptr;
  if (cuda_event == nullptr && cuda_stream == nullptr) return Status::OK();
  return Status::Unsupported(
      "a CUDA event or stream was given, but this gradsync was built "
      "without CUDA");
}

Status OrderStreamAfter(const std::shared_ptr<StreamEvent>& done, void*) {
  return done == nullptr ? Status::OK() : done->Wait(kWaitForever);
}

Status UseDeviceOfEvent(const StreamEvent&) { return Status::OK(); }

CallerDeviceScope::CallerDeviceScope() = default;
CallerDeviceScope::~CallerDeviceScope() = default;

}  // namespace gradsync
