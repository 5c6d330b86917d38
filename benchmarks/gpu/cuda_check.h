// The GPU benchmarks' check of every CUDA and NCCL call: a failure is printed with the call and
// ends the process, as a benchmark has nothing to recover.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(call)                                                      \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)
#define CHECK_NCCL(call)                                                      \
  do {                                                                        \
    ncclResult_t r_ = (call);                                                 \
    if (r_ != ncclSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, ncclGetErrorString(r_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)
