#include <cuda_runtime.h>

#include "ops/device/gpu_inventory.h"
#include "runtime/logging.h"

namespace gradsync {

std::vector<std::string> VisibleGpuBusIds() {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    Log().debug("placement: no usable GPU (cudaGetDeviceCount: {})", cudaGetErrorString(counted));
    cudaGetLastError();  // not sticky, but leave no error for the application to find
    return {};
  }
  std::vector<std::string> bus_ids;
  for (int device = 0; device < count; ++device) {
    char bus_id[32] = {};
    const cudaError_t asked = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device);
    if (asked != cudaSuccess) {
      Log().warn(
          "placement: cudaDeviceGetPCIBusId failed for device {}: {}; placing as without a "
          "GPU",
          device, cudaGetErrorString(asked));
      cudaGetLastError();
      return {};
    }
    bus_ids.emplace_back(bus_id);
  }
  return bus_ids;
}

}  // namespace gradsync
