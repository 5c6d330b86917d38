#include "test/gpu/gpu_test_kernels.h"

#include <cuda_runtime.h>

namespace gradsync {
namespace testing {
namespace {

__global__ void SlowFill(volatile int* release, float* out, long long count, float value,
                         long long max_spin_ns) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    const long long start = clock64();
    // clock64 counts cycles; 1 GHz or more makes this at least max_spin_ns.
    while (*release == 0 && clock64() - start < max_spin_ns) {
    }
  }
  __syncthreads();
  for (long long i = threadIdx.x; i < count; i += blockDim.x) out[i] = value;
}

__global__ void WaitThenWrite(volatile int* release, int* out, int value) {
  while (*release == 0) {
  }
  *out = value;
}

__global__ void CopyInt(const int* in, int* out) { *out = *in; }

}  // namespace

void LaunchSlowFill(void* stream, volatile int* release, float* out, long long count, float value,
                    long long max_spin_ns) {
  SlowFill<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(release, out, count, value,
                                                             max_spin_ns);
}

void LaunchWaitThenWrite(void* stream, volatile int* release, int* out, int value) {
  WaitThenWrite<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(release, out, value);
}

void LaunchCopyInt(void* stream, const int* in, int* out) {
  CopyInt<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(in, out);
}

}  // namespace testing
}  // namespace gradsync
