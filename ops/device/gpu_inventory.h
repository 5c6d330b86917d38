// The GPUs this process can see, for placement at init: each by its PCI bus id, in the order of
// their device indexes (as CUDA_VISIBLE_DEVICES leaves them).
//
// Thread safety: may be called from any thread.
#pragma once

#include <string>
#include <vector>

namespace gradsync {

// Empty in a build without CUDA, and where no device or driver is usable: placement then goes by
// NUMA node, and device tensors fail at their first operation with their own error.
std::vector<std::string> VisibleGpuBusIds();

}  // namespace gradsync
