#include "ops/cuda/cuda_status.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace gradsync {

Status CudaResult(int cuda_error, const char* call, int device) {
  const auto error = static_cast<cudaError_t>(cuda_error);
  if (error == cudaSuccess) return Status::OK();
  return Status(StatusCode::kCudaError, std::string(call) + " on cuda:" + std::to_string(device) +
                                            " failed: " + cudaGetErrorName(error) + " (" +
                                            cudaGetErrorString(error) + ")");
}

Status NcclResult(int nccl_result, const char* call, int device) {
  const auto result = static_cast<ncclResult_t>(nccl_result);
  if (result == ncclSuccess) return Status::OK();
  std::string message = std::string(call) + " on cuda:" + std::to_string(device) +
                        " failed: " + ncclGetErrorString(result);
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && detail[0] != '\0') message += std::string(" (") + detail + ")";
  return Status(StatusCode::kCudaError, message);
}

}  // namespace gradsync
