// The host's cost of launching one batched copy, by the number of tensors it moves and by how its
// descriptors reach the kernel: in the kernel's parameter (or staged, past 96 segments), from a
// table kept on the device for a copy that repeats, and a one-float kernel as the floor.
#pragma once

namespace gradsync_bench {

// Prints the table for GPU `device` (the current one), medians of `iters` batches.
void CopyLaunchCost(int device, int iters);

}  // namespace gradsync_bench
