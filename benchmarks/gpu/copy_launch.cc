#include "copy_launch.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bench_common.h"
#include "busy_kernel.h"
#include "cuda_check.h"
#include "ops/cuda/batched_copy_kernel.h"
#include "ops/cuda/cuda_batched_copy.h"

namespace gradsync_bench {
namespace {

constexpr int kLaunchesPerBatch = 32;
constexpr int64_t kElementsPerSegment = 1024;

// Host microseconds per launch made by `launch`, the median over `iters` batches. Held, each
// batch queues behind a kernel that keeps the stream busy past the batch's launches, as a
// bucket's copies queue behind the backward that produces its gradients.
template <typename Launch>
double MicrosecondsPerLaunch(cudaStream_t stream, float* scratch, long long hold_cycles, bool held,
                             int iters, Launch launch) {
  std::vector<double> per_launch;
  for (int i = 0; i < iters + 2; ++i) {
    if (held) LaunchBusyLayer(stream, scratch, 1, 0.0f, hold_cycles);
    const auto start = std::chrono::steady_clock::now();
    for (int l = 0; l < kLaunchesPerBatch; ++l) launch();
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (i >= 2) per_launch.push_back(took.count() / kLaunchesPerBatch);
  }
  return Median(per_launch);
}

}  // namespace

void CopyLaunchCost(int device, int iters) {
  constexpr int kMaxSegments = 160;
  float* buffers = nullptr;
  const size_t floats = 2 * kMaxSegments * kElementsPerSegment;
  CHECK_CUDA(cudaMalloc(&buffers, floats * sizeof(float) + sizeof(float)));
  float* scratch = buffers + floats;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::unique_ptr<gradsync::CudaBatchedCopier> with_parameter, with_tables;
  if (!gradsync::CudaBatchedCopier::Create(device, false, &with_parameter).ok() ||
      !gradsync::CudaBatchedCopier::Create(device, true, &with_tables).ok()) {
    std::abort();
  }
  int clock_khz = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  const long long hold_cycles = static_cast<long long>(clock_khz) * 5;  // 5 ms
  std::printf(
      "\n# batched copy launch, host us per launch, median of %d batches of %d; held: queued "
      "behind a running kernel; param: descriptors in the kernel's parameter (staged past %d "
      "segments); table: the same copy repeated, descriptors kept on the device\n",
      iters, kLaunchesPerBatch, gradsync::InlineCopyPlan::kMaxSegments);
  std::printf("%9s %11s %11s %11s %11s %12s %12s\n", "segments", "param_free", "param_held",
              "table_free", "table_held", "kernel_free", "kernel_held");
  for (int n : {1, 4, 5, 24, 96, 160}) {
    std::vector<gradsync::CopySegment> segments;
    for (int s = 0; s < n; ++s) {
      segments.push_back({buffers + s * kElementsPerSegment,
                          buffers + (kMaxSegments + s) * kElementsPerSegment, kElementsPerSegment,
                          1.0});
    }
    auto launcher = [&](gradsync::CudaBatchedCopier* copier) {
      return [&, copier] {
        if (!copier->Launch(segments, gradsync::DataType::kFloat32, stream).ok()) std::abort();
      };
    };
    const auto kernel = [&] { LaunchBusyLayer(stream, scratch, 1, 0.0f, 0); };
    double figures[6];
    int column = 0;
    for (bool held : {false, true}) {
      figures[column++] = MicrosecondsPerLaunch(stream, scratch, hold_cycles, held, iters,
                                                launcher(with_parameter.get()));
    }
    for (bool held : {false, true}) {
      figures[column++] = MicrosecondsPerLaunch(stream, scratch, hold_cycles, held, iters,
                                                launcher(with_tables.get()));
    }
    for (bool held : {false, true}) {
      figures[column++] = MicrosecondsPerLaunch(stream, scratch, hold_cycles, held, iters, kernel);
    }
    std::printf("%9d %11.2f %11.2f %11.2f %11.2f %12.2f %12.2f\n", n, figures[0], figures[1],
                figures[2], figures[3], figures[4], figures[5]);
  }
  with_parameter.reset();
  with_tables.reset();
  cudaStreamDestroy(stream);
  cudaFree(buffers);
}

}  // namespace gradsync_bench
