// The overlap benchmark's raw baselines: the same synthetic backward, with DDP's buckets each
// reduced by one ncclAllReduce on a stream of its own as soon as its last layer is launched.
// - Bucket views: every gradient a view into its flat bucket (as PyTorch DDP lays them out with
//   gradient_as_bucket_view=True). Three CUDA calls a bucket (an event, a wait, the collective)
//   and no copies: the least a runtime can launch for this backward, so its step over
//   max(compute, communication) is the floor of gradsync's figure on the same machine.
// - Copies: DDP's default layout. Each layer writes a gradient of its own, copied into its bucket
//   right after the layer (DDP's hook) and back once the bucket is reduced: what PyTorch DDP
//   launches, without its Python.
//
// Thread safety: one caller; every rank of MPI_COMM_WORLD calls it together, each with a GPU of
// its own (an NCCL communicator cannot hold two ranks of one GPU).
#pragma once

#include <cstdint>
#include <vector>

namespace gradsync_bench {

struct RawOverlap {
  int buckets = 0;
  // Medians over the timed steps, the slowest rank's, in seconds.
  double compute = 0;        // the layers alone
  double communication = 0;  // the buckets' allreduces alone
  double step = 0;           // the layers with each bucket reduced once its last layer is launched
  double launch = 0;         // the host's part of `step`: its launches
  double step_copies = 0;    // the same in DDP's default layout, copies included
  double launch_copies = 0;
};

// `counts`: the gradients' element counts (float32) in registration order; the backward produces
// them last first. `cycles`: each layer's busy work; `bucket_bytes`: a bucket closes once it
// holds at least this much (DDP's bucket_cap_mb). Exits the process on a CUDA or NCCL failure.
RawOverlap MeasureRawOverlap(const std::vector<int64_t>& counts, long long cycles,
                             int64_t bucket_bytes, int iters);

}  // namespace gradsync_bench
