#include "ops/cuda/batched_copy_kernel.h"

#include <cuda_runtime.h>

#include <string>

namespace gradsync {
namespace {

// 256 lanes of 16 bytes cover a 4 KiB stripe per pass: a 16 KiB chunk is four passes.
constexpr int kLanes = 256;

template <typename T>
__global__ void BatchedCopyKernel(const CopySegment* segments, const int64_t* first_chunk,
                                  int num_segments) {
  RunCopyChunk<T>(segments, first_chunk, num_segments, static_cast<int64_t>(blockIdx.x),
                  static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

template <typename T>
__global__ void InlineBatchedCopyKernel(const InlineCopyPlan plan) {
  RunCopyChunk<T>(plan.segments, plan.first_chunk, plan.num_segments,
                  static_cast<int64_t>(blockIdx.x), static_cast<int>(threadIdx.x),
                  static_cast<int>(blockDim.x));
}

static_assert(sizeof(InlineCopyPlan) <= 4096, "kernel parameters are limited to 4 KiB");

Status LaunchStatus() {
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string("batched copy kernel launch failed: ") +
                                              cudaGetErrorString(launched));
  }
  return Status::OK();
}

Status CheckGrid(int64_t total_chunks) {
  // The grid's x dimension holds 2^31 - 1 blocks, 32 TiB of 16 KiB chunks.
  if (total_chunks > 0x7FFFFFFF) {
    return Status::InvalidArgument("a batched copy of more than 2^31 - 1 chunks");
  }
  return Status::OK();
}

}  // namespace

Status LaunchInlineBatchedCopy(const InlineCopyPlan& plan, DataType dtype, void* stream) {
  const int64_t total_chunks = plan.first_chunk[plan.num_segments];
  if (total_chunks == 0) return Status::OK();
  GRADSYNC_RETURN_IF_ERROR(CheckGrid(total_chunks));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const bool known = DispatchStorageType(dtype, [&](auto storage) {
    using T = decltype(storage);
    InlineBatchedCopyKernel<T>
        <<<static_cast<unsigned>(total_chunks), kLanes, 0, cuda_stream>>>(plan);
  });
  if (!known) return Status::InvalidArgument("a batched copy of an unknown data type");
  return LaunchStatus();
}

Status LaunchBatchedCopy(const CopySegment* device_segments, const int64_t* device_first_chunk,
                         int num_segments, int64_t total_chunks, DataType dtype, void* stream) {
  if (total_chunks == 0) return Status::OK();
  GRADSYNC_RETURN_IF_ERROR(CheckGrid(total_chunks));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const bool known = DispatchStorageType(dtype, [&](auto storage) {
    using T = decltype(storage);
    BatchedCopyKernel<T><<<static_cast<unsigned>(total_chunks), kLanes, 0, cuda_stream>>>(
        device_segments, device_first_chunk, num_segments);
  });
  if (!known) return Status::InvalidArgument("a batched copy of an unknown data type");
  return LaunchStatus();
}

}  // namespace gradsync
