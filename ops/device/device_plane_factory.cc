// What both builds' factories share: the test override.
#include <atomic>

#include "ops/device/device_plane_factory.h"

namespace gradsync {
namespace {

std::atomic<DevicePlaneFactory> g_factory_for_testing{nullptr};

}  // namespace

void SetDevicePlaneFactoryForTesting(DevicePlaneFactory factory) {
  g_factory_for_testing.store(factory);
}

DevicePlaneFactory DevicePlaneFactoryForTesting() { return g_factory_for_testing.load(); }

}  // namespace gradsync
