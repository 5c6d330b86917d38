#include "ops/cuda/cuda_batched_copy.h"

#include <cuda_runtime.h>

#include <cstring>

#include "ops/cuda/batched_copy_kernel.h"
#include "ops/cuda/cuda_status.h"

namespace gradsync {

CudaBatchedCopier::~CudaBatchedCopier() {
  for (auto& block : blocks_) {
    if (block->read != nullptr) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(block->read));
      cudaEventDestroy(static_cast<cudaEvent_t>(block->read));
    }
    cudaFreeHost(block->host);
    cudaFree(block->device);
  }
}

Status CudaBatchedCopier::Acquire(size_t bytes, Staging** staging) {
  for (auto& block : blocks_) {
    if (block->capacity < bytes) continue;
    const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(block->read));
    if (state == cudaErrorNotReady) continue;
    GRADSYNC_RETURN_IF_ERROR(CudaResult(state, "cudaEventQuery", device_));
    *staging = block.get();
    return Status::OK();
  }
  auto block = std::make_unique<Staging>();
  block->capacity = bytes < 4096 ? 4096 : bytes * 2;
  GRADSYNC_CUDA_CALL(cudaMallocHost(&block->host, block->capacity), device_);
  GRADSYNC_CUDA_CALL(cudaMalloc(&block->device, block->capacity), device_);
  cudaEvent_t read = nullptr;
  GRADSYNC_CUDA_CALL(cudaEventCreateWithFlags(&read, cudaEventDisableTiming), device_);
  block->read = read;
  blocks_.push_back(std::move(block));
  *staging = blocks_.back().get();
  return Status::OK();
}

Status CudaBatchedCopier::Launch(const std::vector<CopySegment>& segments, DataType dtype,
                                 void* stream) {
  if (segments.empty()) return Status::OK();
  const std::vector<int64_t> first_chunk =
      PlanCopyChunks(segments.data(), static_cast<int>(segments.size()), DataTypeSize(dtype));
  if (first_chunk.back() == 0) return Status::OK();
  const size_t segment_bytes = segments.size() * sizeof(CopySegment);
  const size_t plan_bytes = first_chunk.size() * sizeof(int64_t);
  Staging* staging = nullptr;
  GRADSYNC_RETURN_IF_ERROR(Acquire(segment_bytes + plan_bytes, &staging));
  std::memcpy(staging->host, segments.data(), segment_bytes);
  std::memcpy(static_cast<char*>(staging->host) + segment_bytes, first_chunk.data(), plan_bytes);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  GRADSYNC_CUDA_CALL(cudaMemcpyAsync(staging->device, staging->host, segment_bytes + plan_bytes,
                                     cudaMemcpyHostToDevice, cuda_stream),
                     device_);
  const auto* device_segments = static_cast<const CopySegment*>(staging->device);
  const auto* device_plan =
      reinterpret_cast<const int64_t*>(static_cast<const char*>(staging->device) + segment_bytes);
  GRADSYNC_RETURN_IF_ERROR(LaunchBatchedCopy(device_segments, device_plan,
                                             static_cast<int>(segments.size()), first_chunk.back(),
                                             dtype, stream));
  GRADSYNC_CUDA_CALL(cudaEventRecord(static_cast<cudaEvent_t>(staging->read), cuda_stream),
                     device_);
  return Status::OK();
}

}  // namespace gradsync
