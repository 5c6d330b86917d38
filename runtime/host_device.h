// GRADSYNC_HOST_DEVICE marks a function that both host code and CUDA kernels call, so that the two
// compute the same bits from one definition. Outside nvcc it expands to nothing.
//
// Thread safety: a macro.
#pragma once

#if defined(__CUDACC__)
#define GRADSYNC_HOST_DEVICE __host__ __device__
#else
#define GRADSYNC_HOST_DEVICE
#endif
