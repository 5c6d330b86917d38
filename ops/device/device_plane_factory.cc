// What both builds' factories share: the completion timeout and the test override.
#include <atomic>

#include "ops/device/device_plane_factory.h"

namespace gradsync {
namespace {

std::atomic<DevicePlaneFactory> g_factory_for_testing{nullptr};

}  // namespace

std::chrono::nanoseconds DeviceCompletionTimeout(const Config& config) {
  if (config.nccl_timeout_seconds == 0) return std::chrono::nanoseconds::max();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(config.nccl_timeout_seconds));
}

void SetDevicePlaneFactoryForTesting(DevicePlaneFactory factory) {
  g_factory_for_testing.store(factory);
}

DevicePlaneFactory DevicePlaneFactoryForTesting() { return g_factory_for_testing.load(); }

}  // namespace gradsync
