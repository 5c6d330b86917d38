#include <nccl.h>

#include "ops/cuda/cuda_status.h"
#include "ops/nccl/nccl_backend.h"

namespace gradsync {

Status NcclBackend::Broadcast(void* buffer, int64_t count, DataType dtype, int root) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  GRADSYNC_RETURN_IF_ERROR(Enter());
  GRADSYNC_NCCL_CALL(
      ncclBroadcast(buffer, buffer, static_cast<size_t>(count),
                    static_cast<ncclDataType_t>(NcclDataTypeOf(dtype)), root,
                    static_cast<ncclComm_t>(comm_), static_cast<cudaStream_t>(cuda_stream())),
      device_);
  return Status::OK();
}

}  // namespace gradsync
