// CUDA and NCCL results as Status values: each call's result is checked where it is made, and a
// failure names the call, the device and the library's message. Free of CUDA includes: codes
// travel as int.
#pragma once

#include "gradsync/status.h"

namespace gradsync {

// OK for cudaSuccess; otherwise a CudaError naming `call` on cuda:`device`.
Status CudaResult(int cuda_error, const char* call, int device);
// OK for ncclSuccess; otherwise a CudaError naming `call`, with NCCL's last error text.
Status NcclResult(int nccl_result, const char* call, int device);

}  // namespace gradsync

#define GRADSYNC_CUDA_CALL(call, device) \
  GRADSYNC_RETURN_IF_ERROR(::gradsync::CudaResult(static_cast<int>(call), #call, (device)))
#define GRADSYNC_NCCL_CALL(call, device) \
  GRADSYNC_RETURN_IF_ERROR(::gradsync::NcclResult(static_cast<int>(call), #call, (device)))
