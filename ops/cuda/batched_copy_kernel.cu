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

// An inline plan cut to a capacity of N segments. A launch's parameter travels in the driver's
// queue of launches and stays there until the kernel runs, so a launch queued behind a producer
// that has not finished holds its bytes all that time: most buckets need a few segments, not the
// whole 4 KiB plan.
template <int N>
struct SizedCopyPlan {
  CopySegment segments[N];
  int64_t first_chunk[N + 1];
  int num_segments;
};

template <typename T, int N>
__global__ void InlineBatchedCopyKernel(const SizedCopyPlan<N> plan) {
  RunCopyChunk<T>(plan.segments, plan.first_chunk, plan.num_segments,
                  static_cast<int64_t>(blockIdx.x), static_cast<int>(threadIdx.x),
                  static_cast<int>(blockDim.x));
}

static_assert(sizeof(SizedCopyPlan<InlineCopyPlan::kMaxSegments>) <= 4096,
              "kernel parameters are limited to 4 KiB");

// A launch with <<<>>> reports only through the thread's last error, which may still hold an
// earlier call's that was handled where it happened (a failed allocation a caller fell back from):
// cleared before each launch, so that the launch is not blamed for it. A sticky error (a broken
// context) fails the launch itself again.
void ClearEarlierError() { static_cast<void>(cudaGetLastError()); }

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

template <int N>
Status LaunchSized(const InlineCopyPlan& plan, int64_t total_chunks, DataType dtype,
                   cudaStream_t stream) {
  SizedCopyPlan<N> sized;
  sized.num_segments = plan.num_segments;
  for (int i = 0; i < plan.num_segments; ++i) sized.segments[i] = plan.segments[i];
  for (int i = 0; i <= plan.num_segments; ++i) sized.first_chunk[i] = plan.first_chunk[i];
  ClearEarlierError();
  const bool known = DispatchStorageType(dtype, [&](auto storage) {
    using T = decltype(storage);
    InlineBatchedCopyKernel<T, N>
        <<<static_cast<unsigned>(total_chunks), kLanes, 0, stream>>>(sized);
  });
  if (!known) return Status::InvalidArgument("a batched copy of an unknown data type");
  return LaunchStatus();
}

// Asks for the attributes of one kernel, which loads it (see LoadBatchedCopyKernels).
template <typename Kernel>
Status LoadKernel(Kernel kernel) {
  cudaFuncAttributes attributes;
  const cudaError_t loaded = cudaFuncGetAttributes(&attributes, kernel);
  if (loaded != cudaSuccess) {
    return Status(StatusCode::kCudaError,
                  std::string("loading a batched copy kernel (cudaFuncGetAttributes) failed: ") +
                      cudaGetErrorString(loaded));
  }
  return Status::OK();
}

}  // namespace

Status LoadBatchedCopyKernels() {
  Status status = Status::OK();
  for (int type = 0; type < kNumDataTypes; ++type) {
    DispatchStorageType(static_cast<DataType>(type), [&](auto storage) {
      using T = decltype(storage);
      for (const Status& loaded :
           {LoadKernel(BatchedCopyKernel<T>), LoadKernel(InlineBatchedCopyKernel<T, 4>),
            LoadKernel(InlineBatchedCopyKernel<T, 24>),
            LoadKernel(InlineBatchedCopyKernel<T, InlineCopyPlan::kMaxSegments>)}) {
        if (status.ok() && !loaded.ok()) status = loaded;
      }
    });
  }
  return status;
}

Status LaunchInlineBatchedCopy(const InlineCopyPlan& plan, DataType dtype, void* stream) {
  const int64_t total_chunks = plan.first_chunk[plan.num_segments];
  if (total_chunks == 0) return Status::OK();
  GRADSYNC_RETURN_IF_ERROR(CheckGrid(total_chunks));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  // Parameters of about 170 B, 1 KiB and 3.9 KiB.
  if (plan.num_segments <= 4) return LaunchSized<4>(plan, total_chunks, dtype, cuda_stream);
  if (plan.num_segments <= 24) return LaunchSized<24>(plan, total_chunks, dtype, cuda_stream);
  return LaunchSized<InlineCopyPlan::kMaxSegments>(plan, total_chunks, dtype, cuda_stream);
}

Status LaunchBatchedCopy(const CopySegment* device_segments, const int64_t* device_first_chunk,
                         int num_segments, int64_t total_chunks, DataType dtype, void* stream) {
  if (total_chunks == 0) return Status::OK();
  GRADSYNC_RETURN_IF_ERROR(CheckGrid(total_chunks));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  ClearEarlierError();
  const bool known = DispatchStorageType(dtype, [&](auto storage) {
    using T = decltype(storage);
    BatchedCopyKernel<T><<<static_cast<unsigned>(total_chunks), kLanes, 0, cuda_stream>>>(
        device_segments, device_first_chunk, num_segments);
  });
  if (!known) return Status::InvalidArgument("a batched copy of an unknown data type");
  return LaunchStatus();
}

}  // namespace gradsync
