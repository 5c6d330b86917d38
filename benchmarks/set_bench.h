// SetBench: one gradient set's buffers and every strategy's step over them, for
// gradsync_bench_models. Every strategy reduces the set's float32 tensors (SUM):
//   gradsync    a gradsync::AllreduceBatch of the tensors in reverse registration order: each
//               started in that order (as backward produces them), then all waited for, as
//               gradsync.torch's DistributedOptimizer does
//   per-tensor  MPI_Allreduce in place on each tensor, same order
//   flat+copy   copy all tensors into one flat buffer, one MPI_Allreduce, copy back: what a
//               framework that fuses by hand pays
//   bucketed    the same in buckets of 25 MiB (PyTorch DDP's default) cut in backward order, one
//               after another
//   flat        the flat MPI_Allreduce alone: meant as a lower bound, printed for reference
//   gs-tensors  gradsync's per-tensor API: gradsync::allreduce() on each tensor in the same order,
//               then every handle waited for; printed for reference, on request only
//   chunk-S     flat+copy with the flat buffer reduced as consecutive MPI_Allreduce calls on
//               pieces of S bytes (1, 4, 16 and 64 MiB): over TCP a few large messages can beat
//               one huge one
//   pipe-S      pieces of S bytes (1, 4 and 16 MiB) in backward order, each copied in and started
//               with MPI_Iallreduce while up to three before it are in flight, and copied out once
//               done: copies and communication overlapped, as a hand-written pipeline does
//
// Used by the benchmark's main thread only; steps are collective over the communicator given.
#pragma once

#include <mpi.h>

#include <gradsync/gradsync.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradient_set.h"

namespace gradsync_bench {

// The columns follow this order; gradsync is first, and every strategy from per-tensor on but
// flat and gs-tensors is a raw one that "best" considers.
inline constexpr const char* kStrategyNames[] = {
    "gradsync", "per-tensor", "flat+copy", "bucketed", "flat",    "gs-tensors", "chunk-1M",
    "chunk-4M", "chunk-16M",  "chunk-64M", "pipe-1M",  "pipe-4M", "pipe-16M"};
inline constexpr int kStrategyCount = 13;
inline constexpr int kGradsync = 0;
inline constexpr int kPerTensor = 1;
inline constexpr int kFlatCopy = 2;
inline constexpr int kBucketed = 3;
inline constexpr int kFlat = 4;
inline constexpr int kGsTensors = 5;
inline constexpr int kFirstChunk = 6;  // the chunk-S strategies, then the pipe-S ones

// One gradient set's buffers and the ways to reduce them. The timed steps run on zeros once
// the result has been verified: sums of zeros stay exact however often they repeat, and the
// collectives cost the same whatever the values.
class SetBench {
 public:
  SetBench(const GradientSet& set, MPI_Comm comm);

  void Gradsync();
  void GradsyncTensors();
  void PerTensor();
  // The raw strategies reduce through `flat`, a buffer of the set's size.
  void FlatWithCopies(float* flat);
  void Bucketed(float* flat);
  void Flat(float* flat);
  void Chunked(int64_t piece_bytes, float* flat);
  void Pipelined(int64_t piece_bytes, float* flat);
  // Every strategy's step, by kStrategyNames' order.
  std::vector<std::function<void()>> Steps();

  // Runs each strategy once on fresh patterns and checks every element on every rank.
  bool VerifyAll();
  void Zero();

 private:
  void FillTensors();
  // Copies tensors [first, last] into their places in `flat`, reduces that span, copies back.
  void ReduceSpanWithCopies(size_t first, size_t last, float* flat);
  // Copies elements [begin, end) of the flat layout from the tensors into `flat` (`in`) or back.
  void CopyFlatRange(int64_t begin, int64_t end, bool in, float* flat);
  // Strategy `k`'s flat buffer: its own while the set is small enough for a cache to matter.
  float* FlatOf(int k);
  bool CheckTensors(const std::string& strategy) const;
  bool CheckFlat(const float* flat) const;

  std::vector<std::string> names_;
  std::vector<std::vector<float>> tensors_;
  std::vector<gradsync::TensorView> views_;
  std::vector<gradsync::AllreduceOptions> options_;
  std::vector<gradsync::Handle> handles_;
  std::unique_ptr<gradsync::AllreduceBatch> batch_;  // lists the tensors in backward order
  // By kStrategyNames' order; empty for gradsync's, per-tensor's and those that share flat_.
  std::vector<std::vector<float>> own_flats_;
  std::vector<float> flat_;
  std::vector<int64_t> offsets_;  // of each tensor in the flat layout
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace gradsync_bench
