#include "ops/cuda/cuda_batched_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>
#include <utility>

#include "ops/cuda/batched_copy_kernel.h"
#include "ops/cuda/cuda_status.h"

namespace gradsync {

Status CudaBatchedCopier::Create(int device, bool tables,
                                 std::unique_ptr<CudaBatchedCopier>* copier) {
  const Status loaded = LoadBatchedCopyKernels();
  if (!loaded.ok()) {
    return Status(loaded.code(), "device " + std::to_string(device) + ": " + loaded.message());
  }
  copier->reset(new CudaBatchedCopier(device, tables));
  return Status::OK();
}

CudaBatchedCopier::~CudaBatchedCopier() {
  // A table's readers are every launch that found it: recording now, on its stream, follows them.
  for (TableBlock& table : table_blocks_) {
    const auto stream = static_cast<cudaStream_t>(table.stream);
    if (cudaEventRecord(static_cast<cudaEvent_t>(table.block->read), stream) != cudaSuccess) {
      cudaStreamSynchronize(stream);
    }
    in_flight_.push_back(std::move(table.block));
  }
  for (auto& block : stranded_) in_flight_.push_back(std::move(block));
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
    if (state == cudaErrorNotReady) return Status::OK();  // nor are the ones recorded after it
    GRADSYNC_RETURN_IF_ERROR(CudaResult(state, "cudaEventQuery", device_));
    free_.push_back(std::move(in_flight_.front()));
    in_flight_.pop_front();
  }
  return Status::OK();
}

Status CudaBatchedCopier::Take(size_t bytes, std::unique_ptr<Staging>* taken) {
  GRADSYNC_RETURN_IF_ERROR(Reclaim());
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i]->capacity < bytes) continue;
    *taken = std::move(free_[i]);
    free_[i] = std::move(free_.back());
    free_.pop_back();
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
  *taken = std::move(block);
  return Status::OK();
}

Status CudaBatchedCopier::Upload(const std::vector<CopySegment>& segments,
                                 const std::vector<int64_t>& first_chunk, Staging* block,
                                 void* stream) {
  const size_t segment_bytes = segments.size() * sizeof(CopySegment);
  const size_t plan_bytes = first_chunk.size() * sizeof(int64_t);
  std::memcpy(block->host, segments.data(), segment_bytes);
  std::memcpy(static_cast<char*>(block->host) + segment_bytes, first_chunk.data(), plan_bytes);
  GRADSYNC_CUDA_CALL(cudaMemcpyAsync(block->device, block->host, segment_bytes + plan_bytes,
                                     cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
                     device_);
  return Status::OK();
}

Status CudaBatchedCopier::LaunchFromDevice(const Staging& block, int num_segments,
                                           int64_t total_chunks, DataType dtype, void* stream) {
  const auto* device_segments = static_cast<const CopySegment*>(block.device);
  const auto* device_plan = reinterpret_cast<const int64_t*>(
      static_cast<const char*>(block.device) + num_segments * sizeof(CopySegment));
  return LaunchBatchedCopy(device_segments, device_plan, num_segments, total_chunks, dtype, stream);
}

Status CudaBatchedCopier::Retire(std::unique_ptr<Staging> block, void* stream) {
  const Status recorded = CudaResult(
      cudaEventRecord(static_cast<cudaEvent_t>(block->read), static_cast<cudaStream_t>(stream)),
      "cudaEventRecord", device_);
  if (!recorded.ok()) {
    // Its last readers are unknown: kept until the copier goes.
    stranded_.push_back(std::move(block));
    return recorded;
  }
  in_flight_.push_back(std::move(block));
  return Status::OK();
}

Status CudaBatchedCopier::LaunchNewTable(const CopyTableCache::Lookup& lookup,
                                         const std::vector<CopySegment>& segments, DataType dtype,
                                         std::vector<int64_t> first_chunk,
                                         std::unique_ptr<Staging> block, void* stream) {
  const int num_segments = static_cast<int>(segments.size());
  const int64_t total_chunks = first_chunk.back();
  const Status uploaded = Upload(segments, first_chunk, block.get(), stream);
  if (!uploaded.ok()) {
    free_.push_back(std::move(block));  // nothing queued reads it
    return uploaded;
  }
  Staging* table_memory = block.get();
  table_blocks_.push_back({std::move(block), stream});
  void* retired = nullptr;
  table_cache_.Insert(lookup, segments, DataTypeSize(dtype), stream, std::move(first_chunk),
                      table_memory, &retired);
  Status retiring = Status::OK();
  if (retired != nullptr) {
    const auto held = std::find_if(table_blocks_.begin(), table_blocks_.end(),
                                   [&](const TableBlock& t) { return t.block.get() == retired; });
    assert(held != table_blocks_.end());  // every table's block is held here
    std::unique_ptr<Staging> old = std::move(held->block);
    void* old_stream = held->stream;
    *held = std::move(table_blocks_.back());
    table_blocks_.pop_back();
    retiring = Retire(std::move(old), old_stream);
  }
  const Status launched =
      LaunchFromDevice(*table_memory, num_segments, total_chunks, dtype, stream);
  return launched.ok() ? retiring : launched;
}

Status CudaBatchedCopier::Launch(const std::vector<CopySegment>& segments, DataType dtype,
                                 void* stream) {
  if (segments.empty()) return Status::OK();
  const int num_segments = static_cast<int>(segments.size());
  CopyTableCache::Lookup lookup;
  if (num_segments > kInlineOnly) {
    lookup = table_cache_.Find(segments, DataTypeSize(dtype), stream);
    if (lookup.table != nullptr) {
      // The copy launched before: its descriptors are on the device already.
      const int64_t total_chunks = lookup.table->first_chunk.back();
      if (total_chunks == 0) return Status::OK();
      return LaunchFromDevice(*static_cast<const Staging*>(lookup.table->memory), num_segments,
                              total_chunks, dtype, stream);
    }
  }
  std::vector<int64_t> first_chunk =
      PlanCopyChunks(segments.data(), num_segments, DataTypeSize(dtype));
  if (first_chunk.back() == 0) return Status::OK();
  const size_t descriptor_bytes =
      segments.size() * sizeof(CopySegment) + first_chunk.size() * sizeof(int64_t);
  if (lookup.worth_a_table) {
    std::unique_ptr<Staging> block;
    if (Take(descriptor_bytes, &block).ok()) {
      return LaunchNewTable(lookup, segments, dtype, std::move(first_chunk), std::move(block),
                            stream);
    }
    // No memory for a table: launched as a copy without one.
  }
  if (num_segments <= InlineCopyPlan::kMaxSegments) {
    // The plan goes as the kernel's parameter, with no staging and no copy.
    InlineCopyPlan plan;
    plan.num_segments = num_segments;
    std::copy(segments.begin(), segments.end(), plan.segments);
    std::copy(first_chunk.begin(), first_chunk.end(), plan.first_chunk);
    return LaunchInlineBatchedCopy(plan, dtype, stream);
  }
  std::unique_ptr<Staging> staging;
  GRADSYNC_RETURN_IF_ERROR(Take(descriptor_bytes, &staging));
  Status launched = Upload(segments, first_chunk, staging.get(), stream);
  if (launched.ok()) {
    launched = LaunchFromDevice(*staging, num_segments, first_chunk.back(), dtype, stream);
  }
  // Recorded even after a failed launch: the upload may have been queued.
  const Status retired = Retire(std::move(staging), stream);
  return launched.ok() ? retired : launched;
}

}  // namespace gradsync
