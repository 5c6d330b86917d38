#include <cuda_runtime.h>

#include "busy_kernel.h"

namespace gradsync_bench {
namespace {

__global__ void BusyLayer(float* gradient, long long count, float value, long long cycles) {
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
  }
  __syncthreads();
  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    gradient[i] = value;
  }
}

}  // namespace

void LaunchBusyLayer(void* stream, float* gradient, long long count, float value,
                     long long cycles) {
  BusyLayer<<<64, 256, 0, static_cast<cudaStream_t>(stream)>>>(gradient, count, value, cycles);
}

}  // namespace gradsync_bench
