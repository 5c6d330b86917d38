// Creates the data plane for tensors on a device, with the backend GRADSYNC_GPU_BACKEND picks:
// NCCL (auto's choice when the build has it) or MPI staged through pinned host memory. A build
// without CUDA has no device plane: every call fails with Unsupported, saying so.
//
// Called by the background thread when a process set's first operation on the device runs.
// Collective over `comm`: every member gets there at the same operation, and every member fails
// alike when one cannot create its plane (the failing ranks are named), so that none is left
// waiting for the others.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/data_plane.h"
#include "runtime/config.h"

namespace gradsync {

Status MakeDevicePlane(const Config& config, MPI_Comm comm, const Device& device,
                       std::unique_ptr<DataPlane>* plane);

// GRADSYNC_NCCL_TIMEOUT_SECONDS as a device plane's completion timeout (0: none).
std::chrono::nanoseconds DeviceCompletionTimeout(const Config& config);

// For tests of the whole path without a GPU: while set, process sets make their device planes
// with `factory` instead of MakeDevicePlane (a DevicePlane over the host backend, say, so that
// "device" tensors in host memory run through the finalizer). Set before init(), cleared after
// shutdown(); null restores MakeDevicePlane.
using DevicePlaneFactory = Status (*)(const Config& config, MPI_Comm comm, const Device& device,
                                      std::unique_ptr<DataPlane>* plane);
void SetDevicePlaneFactoryForTesting(DevicePlaneFactory factory);
DevicePlaneFactory DevicePlaneFactoryForTesting();
// The factory to give it for that: a DevicePlane over HostDeviceBackend, in any build.
Status MakeHostBackedDevicePlane(const Config& config, MPI_Comm comm, const Device& device,
                                 std::unique_ptr<DataPlane>* plane);

// True when this build reduces device tensors (it was built with CUDA).
bool BuiltWithCuda();
// NCCL's version code (ncclGetVersion, 22800 for 2.28.0) in a build with NCCL, else 0.
int NcclVersion();
// Whether CUDA can be used here at all: false (and *devices 0) without a driver or a device, or
// in a build without CUDA.
bool UsableCudaDevices(int* devices);
// Device memory of `bytes` (at least one) on CUDA device `device`, for a collective's output that
// no framework allocates; FreeDeviceMemory returns it after the device's work on it is done.
// Unsupported in a build without CUDA.
Status AllocateDeviceMemory(int device, size_t bytes, void** data);
Status FreeDeviceMemory(int device, void* data);

}  // namespace gradsync
