// The device plane factory of a build with CUDA and NCCL.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ops/cuda/cuda_status.h"
#include "ops/cuda/mpi_staged_backend.h"
#include "ops/device/device_events.h"
#include "ops/device/device_plane.h"
#include "ops/device/device_plane_factory.h"
#include "ops/nccl/nccl_backend.h"
#include "runtime/logging.h"
#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

// What each rank tells the others before any of them creates a communicator: whether it can, and
// where its GPU is, so that ranks sharing one are found.
struct RankRecord {
  int32_t ok = 0;
  char host[64] = {};
  char bus_id[32] = {};  // PCI bus id of the device
  char error[400] = {};
};

void CopyText(const std::string& text, char* out, size_t capacity) {
  std::strncpy(out, text.c_str(), capacity - 1);
  out[capacity - 1] = '\0';
}

RankRecord Describe(const Device& device) {
  RankRecord record;
  gethostname(record.host, sizeof(record.host) - 1);
  int count = 0;
  Status status = CudaResult(cudaGetDeviceCount(&count), "cudaGetDeviceCount", device.index);
  if (!status.ok() || count == 0) {
    status =
        Status(StatusCode::kCudaError,
               "a tensor on " + DeviceName(device) +
                   " arrived, but no CUDA device is usable by this process (" +
                   (status.ok() ? std::string("cudaGetDeviceCount found none") : status.message()) +
                   "); check the driver, CUDA_VISIBLE_DEVICES and the container's GPUs");
  } else if (device.index < 0 || device.index >= count) {
    status = Status::InvalidArgument("cuda:" + std::to_string(device.index) +
                                     " does not exist; this process sees " + std::to_string(count) +
                                     " CUDA device(s)");
  }
  if (status.ok()) {
    status = CudaResult(cudaDeviceGetPCIBusId(record.bus_id, sizeof(record.bus_id), device.index),
                        "cudaDeviceGetPCIBusId", device.index);
  }
  record.ok = status.ok() ? 1 : 0;
  if (!status.ok()) CopyText(status.ToString(), record.error, sizeof(record.error));
  return record;
}

// Fails on every rank alike when any rank failed, naming them.
Status AgreeAllOk(const std::vector<RankRecord>& records) {
  std::string failures;
  for (size_t r = 0; r < records.size(); ++r) {
    if (records[r].ok) continue;
    failures += (failures.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
                records[r].error;
  }
  if (failures.empty()) return Status::OK();
  return Status(StatusCode::kCudaError, "no device plane could be created: " + failures);
}

// "ranks 0 and 1 on host h share GPU 0000:17:00.0", or empty.
std::string SharedGpus(const std::vector<RankRecord>& records) {
  for (size_t a = 0; a < records.size(); ++a) {
    std::vector<size_t> sharing{a};
    for (size_t b = a + 1; b < records.size(); ++b) {
      if (std::strcmp(records[a].host, records[b].host) == 0 &&
          std::strcmp(records[a].bus_id, records[b].bus_id) == 0) {
        sharing.push_back(b);
      }
    }
    if (sharing.size() < 2) continue;
    std::string ranks;
    for (size_t i = 0; i < sharing.size(); ++i) {
      if (i > 0) ranks += i + 1 == sharing.size() ? " and " : ", ";
      ranks += std::to_string(sharing[i]);
    }
    return "ranks " + ranks + " (of this process set) on host " + records[a].host +
           " share the GPU at PCI bus id " + records[a].bus_id;
  }
  return "";
}

Status AgreeCreated(MPI_Comm comm, const Status& created) {
  int ok = created.ok() ? 1 : 0;
  int all_ok = 0;
  GRADSYNC_MPI_CALL(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm));
  if (all_ok) return Status::OK();
  if (!created.ok()) return created;
  return Status(StatusCode::kCudaError,
                "another rank of the process set failed to create its device plane (its log says "
                "why)");
}

}  // namespace

bool BuiltWithCuda() { return true; }

int NcclVersion() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? version : 0;
}

bool UsableCudaDevices(int* devices) {
  *devices = 0;
  return cudaGetDeviceCount(devices) == cudaSuccess && *devices > 0;
}

// Both are called from callers' threads (a framework's output buffer made and freed): the thread
// keeps the device it had.
Status AllocateDeviceMemory(int device, size_t bytes, void** data) {
  *data = nullptr;
  CallerDeviceScope keep_callers_device;
  GRADSYNC_CUDA_CALL(cudaSetDevice(device), device);
  GRADSYNC_CUDA_CALL(cudaMalloc(data, std::max<size_t>(bytes, 1)), device);
  return Status::OK();
}

Status FreeDeviceMemory(int device, void* data) {
  if (data == nullptr) return Status::OK();
  CallerDeviceScope keep_callers_device;
  GRADSYNC_CUDA_CALL(cudaSetDevice(device), device);
  // cudaFree waits for the device's work on `data` before it returns the memory.
  GRADSYNC_CUDA_CALL(cudaFree(data), device);
  return Status::OK();
}

Status MakeDevicePlane(const Config& config, MPI_Comm comm, const Device& device,
                       std::unique_ptr<DataPlane>* plane) {
  int size = 1;
  GRADSYNC_MPI_CALL(MPI_Comm_size(comm, &size));
  const RankRecord mine = Describe(device);
  std::vector<RankRecord> records(size);
  GRADSYNC_MPI_CALL(MPI_Allgather(&mine, sizeof(RankRecord), MPI_BYTE, records.data(),
                                  sizeof(RankRecord), MPI_BYTE, comm));
  GRADSYNC_RETURN_IF_ERROR(AgreeAllOk(records));

  const std::string shared = SharedGpus(records);
  GpuBackend backend = config.gpu_backend;
  if (backend == GpuBackend::kNccl && !shared.empty()) {
    return Status::InvalidArgument(
        "GRADSYNC_GPU_BACKEND=nccl, but " + shared +
        ": NCCL cannot run two ranks on one GPU. Give each rank a GPU of its own (pick the "
        "device by gradsync::local_rank(), or set CUDA_VISIBLE_DEVICES per rank, and launch at "
        "most as many ranks per host as it has GPUs), or set GRADSYNC_GPU_BACKEND=mpi to share "
        "GPUs through MPI");
  }
  if (backend == GpuBackend::kAuto) {
    backend = shared.empty() ? GpuBackend::kNccl : GpuBackend::kMpi;
    if (!shared.empty()) Log().info("{}: reducing device tensors through MPI, not NCCL", shared);
  }

  std::unique_ptr<DeviceBackend> made;
  Status created;
  if (backend == GpuBackend::kNccl) {
    std::unique_ptr<NcclBackend> nccl;
    created = NcclBackend::Create(comm, device.index, config.device_copy_tables, &nccl);
    made = std::move(nccl);
  } else {
    std::unique_ptr<MpiStagedBackend> staged;
    created = MpiStagedBackend::Create(comm, device.index, DeviceCompletionTimeout(config),
                                       config.device_copy_tables, &staged);
    if (created.ok()) {
      Log().info("device tensors on {} go through MPI, {}", DeviceName(device),
                 staged->cuda_aware() ? "directly from device memory (CUDA-aware MPI)"
                                      : "staged through pinned host memory");
    }
    made = std::move(staged);
  }
  GRADSYNC_RETURN_IF_ERROR(AgreeCreated(comm, created));
  *plane = std::make_unique<DevicePlane>(std::move(made), comm, DeviceCompletionTimeout(config));
  return Status::OK();
}

}  // namespace gradsync
