// The device plane factory of a build without CUDA.
#include "ops/device/device_plane_factory.h"

namespace gradsync {

Status MakeDevicePlane(const Config&, MPI_Comm, const Device& device, std::unique_ptr<DataPlane>*) {
  return Status::Unsupported(
      "a tensor on " + DeviceName(device) +
      " arrived, but this gradsync was built without CUDA (GRADSYNC_WITH_CUDA=OFF, or no CUDA "
      "toolkit found at build time); rebuild with CUDA and NCCL to reduce device tensors");
}

bool BuiltWithCuda() { return false; }

int NcclVersion() { return 0; }

bool UsableCudaDevices(int* devices) {
  *devices = 0;
  return false;
}

Status AllocateDeviceMemory(int device, size_t, void** data) {
  *data = nullptr;
  return Status::Unsupported("device memory on " + DeviceName(Device::Cuda(device)) +
                             " was asked for, but this gradsync was built without CUDA");
}

Status FreeDeviceMemory(int, void* data) {
  if (data == nullptr) return Status::OK();
  return Status::Internal("device memory freed in a build without CUDA");
}

}  // namespace gradsync
