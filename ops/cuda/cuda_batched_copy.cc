#include "ops/cuda/cuda_batched_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "ops/cuda/batched_copy_kernel.h"
#include "ops/cuda/cuda_status.h"

namespace gradsync {

Status CudaBatchedCopier::Create(int device, std::unique_ptr<CudaBatchedCopier>* copier) {
  const Status loaded = LoadBatchedCopyKernels();
  if (!loaded.ok()) {
    return Status(loaded.code(), "device " + std::to_string(device) + ": " + loaded.message());
  }
  copier->reset(new CudaBatchedCopier(device));
  return Status::OK();
}

CudaBatchedCopier::~CudaBatchedCopier() {
  auto release = [](Staging& block) {
    if (block.read != nullptr) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(block.read));
      cudaEventDestroy(static_cast<cudaEvent_t>(block.read));
    }
    cudaFreeHost(block.host);
    cudaFree(block.device);
  };
  for (auto& block : in_flight_) release(*block);
  for (auto& block : free_) release(*block);
}

Status CudaBatchedCopier::Reclaim() {
  while (!in_flight_.empty()) {
    const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(in_flight_.front()->read));
    if (state == cudaErrorNotReady) return Status::OK();  // nor are the ones launched after it
    GRADSYNC_RETURN_IF_ERROR(CudaResult(state, "cudaEventQuery", device_));
    free_.push_back(std::move(in_flight_.front()));
    in_flight_.pop_front();
  }
  return Status::OK();
}

Status CudaBatchedCopier::Acquire(size_t bytes, Staging** staging) {
  GRADSYNC_RETURN_IF_ERROR(Reclaim());
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i]->capacity < bytes) continue;
    in_flight_.push_back(std::move(free_[i]));
    free_[i] = std::move(free_.back());
    free_.pop_back();
    *staging = in_flight_.back().get();
    return Status::OK();
  }
  auto block = std::make_unique<Staging>();
  block->capacity = bytes < 4096 ? 4096 : bytes * 2;
  // Owned by `block` from here on, so that a failure below frees what was allocated.
  auto discard = [](Staging* b) {
    if (b->read != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(b->read));
    if (b->host != nullptr) cudaFreeHost(b->host);
    if (b->device != nullptr) cudaFree(b->device);
  };
  Status made =
      CudaResult(cudaMallocHost(&block->host, block->capacity), "cudaMallocHost", device_);
  if (made.ok())
    made = CudaResult(cudaMalloc(&block->device, block->capacity), "cudaMalloc", device_);
  cudaEvent_t read = nullptr;
  if (made.ok()) {
    made = CudaResult(cudaEventCreateWithFlags(&read, cudaEventDisableTiming),
                      "cudaEventCreateWithFlags", device_);
    block->read = read;
  }
  if (!made.ok()) {
    discard(block.get());
    return made;
  }
  in_flight_.push_back(std::move(block));
  *staging = in_flight_.back().get();
  return Status::OK();
}

Status CudaBatchedCopier::Launch(const std::vector<CopySegment>& segments, DataType dtype,
                                 void* stream) {
  if (segments.empty()) return Status::OK();
  const std::vector<int64_t> first_chunk =
      PlanCopyChunks(segments.data(), static_cast<int>(segments.size()), DataTypeSize(dtype));
  if (first_chunk.back() == 0) return Status::OK();
  if (segments.size() <= static_cast<size_t>(InlineCopyPlan::kMaxSegments)) {
    // Most buckets: the plan goes as the kernel's parameter, with no staging and no copy.
    InlineCopyPlan plan;
    plan.num_segments = static_cast<int>(segments.size());
    std::copy(segments.begin(), segments.end(), plan.segments);
    std::copy(first_chunk.begin(), first_chunk.end(), plan.first_chunk);
    return LaunchInlineBatchedCopy(plan, dtype, stream);
  }
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
