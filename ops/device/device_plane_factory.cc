// What both builds' factories share: the completion timeout and the test override.
#include "ops/device/device_plane_factory.h"

#include <atomic>
#include <utility>

#include "ops/device/device_plane.h"
#include "ops/device/host_device_backend.h"

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

Status MakeHostBackedDevicePlane(const Config& config, MPI_Comm comm, const Device&,
                                 std::unique_ptr<DataPlane>* plane) {
  std::unique_ptr<HostDeviceBackend> backend;
  // As the CUDA build's MPI backend: a plane destroyed while its stream is stuck in a collective
  // ends the job after the completion timeout instead of waiting for ever.
  const std::chrono::nanoseconds timeout = DeviceCompletionTimeout(config);
  GRADSYNC_RETURN_IF_ERROR(HostDeviceBackend::Create(comm, &backend, timeout));
  *plane = std::make_unique<DevicePlane>(std::move(backend), comm, timeout);
  return Status::OK();
}

}  // namespace gradsync
