#include <nccl.h>

#include "ops/cuda/cuda_status.h"
#include "ops/nccl/nccl_backend.h"

namespace gradsync {

Status NcclBackend::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                              ReduceOp op) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  GRADSYNC_RETURN_IF_ERROR(Enter());
  GRADSYNC_NCCL_CALL(
      ncclAllReduce(send, recv, static_cast<size_t>(count),
                    static_cast<ncclDataType_t>(NcclDataTypeOf(dtype)),
                    static_cast<ncclRedOp_t>(NcclRedOpOf(op)), static_cast<ncclComm_t>(comm_),
                    static_cast<cudaStream_t>(cuda_stream())),
      device_);
  return Status::OK();
}

}  // namespace gradsync
