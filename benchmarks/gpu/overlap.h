// The overlap benchmark: a synthetic backward on a compute stream (one busy kernel per gradient
// of ResNet-50, last layer first, calibrated so that compute alone takes `compute_scale` times
// as long as the reductions alone), each gradient enqueued as its kernel is launched with the
// compute stream as its readiness. The step (launch to every handle done) against compute alone
// and communication alone, same run; the goal is step <= 1.1 x max(compute, communication).
//
// Timed twice, in two gradient layouts: apart (a cudaMalloc each, so gradsync copies each bucket
// in and out) and flat (views into one allocation, in the order backward produces them, as DDP's
// gradient_as_bucket_view lays them out, so each bucket is reduced where it lies). Then the raw
// baselines of the same (raw_overlap.h) where the ranks can form an NCCL communicator.
//
// Thread safety: every rank of MPI_COMM_WORLD calls it together, after gradsync::init().
#pragma once

#include <string>

namespace gradsync_bench {

struct OverlapOptions {
  std::string data_dir;  // holds resnet50.txt
  int iters = 20;
  double compute_scale = 1.0;
  bool raw_nccl = true;  // whether the raw baselines can run (an NCCL communicator can be formed)
};

// Prints the tables on rank 0. Exits the process on a CUDA or NCCL failure.
void Overlap(const OverlapOptions& options, int device);

}  // namespace gradsync_bench
