// Cost model of a process set's host allreduce paths, fitted to what calibration measured on the
// set's own communicator, and the fusion settings it implies.
//
// Two ways to reduce a tensor of b bytes: alone, in place (one collective of its own), or packed
// with others into a fused bucket (a copy in, one collective for the bucket, a copy out). Each is
// modelled as a linear cost: fixed + per_byte x bytes + per_tensor x tensors. Adding a tensor to
// a bucket costs fused.per_byte x b + fused.per_tensor; reducing it alone costs in_place.fixed +
// in_place.per_byte x b. Alone wins from the size where the two cross: over shared memory the
// copies make the bucket dearer per byte and large tensors go alone; over a network the fixed cost
// of a collective dominates and everything is fused.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/mpi/allreduce_calibration.h"

namespace gradsync {

struct LinearCost {
  double fixed_us = 0;
  double per_byte_us = 0;
  double per_tensor_us = 0;
  double Predict(double bytes, int tensors = 1) const {
    return fixed_us + per_byte_us * bytes + per_tensor_us * tensors;
  }
};

// The terms a fit may use: a reduction alone costs per tensor and per byte; a fused bucket once,
// per byte and per tensor.
enum CostTerm : int { kFixed = 1, kPerByte = 2, kPerTensor = 4 };

// The least-squares fit of `samples` over the `terms` (a CostTerm mask), by relative error, every
// coefficient at least 0 (a term whose best fit is negative is dropped and the rest refitted).
LinearCost FitLinearCost(const std::vector<CostSample>& samples, int terms);

struct AllreduceCosts {
  LinearCost in_place;
  LinearCost fused;
};

// The smallest tensor, in bytes, predicted to be reduced faster alone in place than inside a fused
// bucket; kNeverInPlace when fusing is never slower. Rounded up to a multiple of 4 KiB so that
// the noise of the last digits of a measurement does not split the ranks' choices (every rank
// computes it from the same reduced numbers anyway).
// Never below kSmallestInPlace: a tensor alone also costs a bucket and a completion of its own,
// which calibration does not time, and its smallest rung is 4 KiB tensors.
constexpr int64_t kNeverInPlace = int64_t{1} << 40;
constexpr int64_t kSmallestInPlace = 64 << 10;
int64_t InPlaceCutoff(const AllreduceCosts& costs);

// The in-place cutoff a plan uses: InPlaceCutoff's, but never above `bucket_cap` (and never below
// kSmallestInPlace). A tensor as large as the largest bucket fills a bucket of its own: fused, it
// shares no collective and only adds copies in and out, through memory rather than the cache that
// calibration's ladder ran in (over shared memory, on a path calibration did not even time). Where
// the fitted per-byte costs of the two ways are close, as over a network, the crossing flips from
// one calibration to the next; this bound keeps the largest tensors off the copies either way.
int64_t PlannedInPlaceCutoff(const AllreduceCosts& costs, int64_t bucket_cap);

// The largest fused bucket to plan: big enough that a bucket's fixed cost is at most 5% of its
// time, at least the largest bucket calibration measured (beyond it the fit is extrapolated), and
// at most `configured` (GRADSYNC_FUSION_THRESHOLD). Over shared memory that is a few MiB, where a
// larger bucket would leave the calibrated path; over a network, where each collective pays
// milliseconds, it is the configured maximum, or half of `cache_bytes` (the node's last-level
// cache; 0 when unknown) if that is less: a bucket copied in and reduced while it stays in the
// cache beats one that goes through memory, which calibration's small ladder cannot see.
int64_t FusedBucketCap(const AllreduceCosts& costs, double largest_measured, int64_t configured,
                       int64_t cache_bytes);

// The smallest bucket, in bytes, predicted to be reduced faster by the hierarchical path than by
// the flat one, counting the hierarchical path's bytes at 4/3 of their fitted cost (it must win
// per byte by a quarter); kNeverInPlace (never) when it does not.
int64_t HierarchicalFrom(const LinearCost& flat, const LinearCost& hierarchical);

// The piece size for the plane's MPI allreduces (MpiDataPlane::set_piece_bytes) from the piece
// probe's samples: the fastest piece size when it beat the whole probe by kPieceMargin at least,
// else 0 (whole). A large allreduce in pieces that stay in a core's cache can take half the time
// of one through memory (docs/benchmarks.md); where the two are close, whole allreduces keep each
// tensor to one collective. 0 without a whole sample.
constexpr double kPieceMargin = 0.1;
int64_t ChoosePieceBytes(const std::vector<PieceSample>& samples);
// "in pieces of 1 MiB (a 32 MiB allreduce: 16.4 ms so, 30.5 ms whole)", or "whole (...)".
std::string DescribePieceChoice(const std::vector<PieceSample>& samples, int64_t chosen);

// "alone 0.0 us + 35.20 us/tensor + 0.410 ns/B; fused 41.0 us + 0.30 us/tensor + 0.520 ns/B"
std::string DescribeCosts(const AllreduceCosts& costs);
// "41.0 us + 0.30 us/tensor + 0.520 ns/B"
std::string DescribeCost(const LinearCost& cost);
// "512 KiB", "never" for kNeverInPlace
std::string DescribeBytes(int64_t bytes);

}  // namespace gradsync
