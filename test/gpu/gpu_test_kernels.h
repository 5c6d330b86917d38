// Small kernels the GPU tests launch, behind a CUDA-free interface (streams as void*), so that the
// tests themselves build as host C++ with MPI and GoogleTest.
#pragma once

namespace gradsync {
namespace testing {

// Launches on `stream` a kernel that spins until *release (mapped host memory) is non-zero or
// `max_spin_ns` passes, then fills `count` floats at `out` with `value`.
void LaunchSlowFill(void* stream, volatile int* release, float* out, long long count, float value,
                    long long max_spin_ns);

// Launches on `stream` one thread that spins until *release (mapped host memory) is non-zero,
// however long that takes, then writes `value` to *out.
void LaunchWaitThenWrite(void* stream, volatile int* release, int* out, int value);

// Launches on `stream` one thread that copies *in to *out.
void LaunchCopyInt(void* stream, const int* in, int* out);

}  // namespace testing
}  // namespace gradsync
