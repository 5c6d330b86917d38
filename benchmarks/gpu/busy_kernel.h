// A stand-in for one layer's backward kernel, behind a CUDA-free interface: it keeps the device
// busy for a given number of cycles, then writes the layer's gradient.
#pragma once

namespace gradsync_bench {

// On `stream` (a cudaStream_t): spins `cycles` clock cycles, then sets `count` floats at
// `gradient` to `value`.
void LaunchBusyLayer(void* stream, float* gradient, long long count, float value, long long cycles);

}  // namespace gradsync_bench
