#include "coordinator/cost_model.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

std::vector<CostSample> Measure(const LinearCost& truth, const std::vector<CostSample>& shapes) {
  std::vector<CostSample> samples = shapes;
  for (CostSample& s : samples) s.us = truth.Predict(s.bytes, s.tensors);
  return samples;
}

TEST(CostModelTest, FitRecoversAnExactLinearCost) {
  const LinearCost truth{40.0, 0.5e-3, 0.3};
  const LinearCost fit = FitLinearCost(
      Measure(truth, {{262144, 64}, {1 << 20, 16}, {4 << 20, 64}, {262144, 4}, {1 << 20, 256}}),
      kFixed | kPerByte | kPerTensor);
  EXPECT_NEAR(fit.fixed_us, 40.0, 1e-6);
  EXPECT_NEAR(fit.per_byte_us, 0.5e-3, 1e-12);
  EXPECT_NEAR(fit.per_tensor_us, 0.3, 1e-6);
}

// The same samples a thousand times slower (100 ms rungs: a slow network at many ranks) fit the
// same terms a thousand times larger: nothing is dropped as degenerate for the times' scale.
TEST(CostModelTest, FitDoesNotDependOnTheTimesScale) {
  const std::vector<CostSample> shapes = {
      {262144, 64}, {1 << 20, 16}, {4 << 20, 64}, {262144, 4}, {1 << 20, 256}};
  for (const double slower : {1.0, 1e3, 1e6}) {
    const LinearCost truth{40.0 * slower, 0.5e-3 * slower, 0.3 * slower};
    const LinearCost fit = FitLinearCost(Measure(truth, shapes), kFixed | kPerByte | kPerTensor);
    EXPECT_NEAR(fit.fixed_us / slower, 40.0, 1e-6) << slower;
    EXPECT_NEAR(fit.per_byte_us / slower, 0.5e-3, 1e-12) << slower;
    EXPECT_NEAR(fit.per_tensor_us / slower, 0.3, 1e-6) << slower;
  }
}

TEST(CostModelTest, FitWithoutPerTensorTerm) {
  const LinearCost truth{12.0, 0.25e-3, 0};
  const LinearCost fit = FitLinearCost(
      Measure(truth, {{16384, 1}, {262144, 1}, {1 << 20, 1}, {4 << 20, 1}}), kFixed | kPerByte);
  EXPECT_NEAR(fit.fixed_us, 12.0, 1e-6);
  EXPECT_NEAR(fit.per_byte_us, 0.25e-3, 1e-12);
  EXPECT_EQ(fit.per_tensor_us, 0);
}

TEST(CostModelTest, AloneReductionsFitPerTensorAndPerByte) {
  // k tensors of s bytes, each reduced alone: k x 20 us + 0.4 ns/B.
  const LinearCost truth{0, 0.4e-3, 20};
  const LinearCost fit = FitLinearCost(
      Measure(truth, {{262144, 64}, {4 << 20, 64}, {4 << 20, 16}, {4 << 20, 4}, {8 << 20, 2}}),
      kPerByte | kPerTensor);
  EXPECT_EQ(fit.fixed_us, 0);
  EXPECT_NEAR(fit.per_tensor_us, 20, 1e-6);
  EXPECT_NEAR(fit.per_byte_us, 0.4e-3, 1e-12);
}

TEST(CostModelTest, NegativeTermsAreDroppedNotKept) {
  // Noise that makes bigger messages look cheaper per byte at the small end.
  const LinearCost fit = FitLinearCost(
      {{16384, 1, 30}, {262144, 1, 20}, {1 << 20, 1, 25}, {4 << 20, 1, 28}}, kFixed | kPerByte);
  EXPECT_GE(fit.fixed_us, 0);
  EXPECT_GE(fit.per_byte_us, 0);
}

TEST(CostModelTest, SharedMemoryLikeCostsSendLargeTensorsAlone) {
  // Collectives cheap to start; the fused path pays two copies per byte more.
  AllreduceCosts costs;
  costs.in_place = {20.0, 0.40e-3, 0};
  costs.fused = {25.0, 0.60e-3, 0.05};
  const int64_t cutoff = InPlaceCutoff(costs);
  // (20 - 0.05) / 0.2e-3 = 99750 bytes, rounded up to 4 KiB.
  EXPECT_EQ(cutoff, 102400);
  costs.in_place.fixed_us = 5;  // 24750 bytes: below the floor
  EXPECT_EQ(InPlaceCutoff(costs), kSmallestInPlace);
  EXPECT_EQ(cutoff % 4096, 0);
}

TEST(CostModelTest, NetworkLikeCostsFuseEverything) {
  AllreduceCosts costs;
  costs.in_place = {7000.0, 1.0e-3, 0};  // every collective pays milliseconds
  costs.fused = {7000.0, 1.2e-3, 0.05};
  EXPECT_GT(InPlaceCutoff(costs), int64_t{30} << 20);
  costs.fused.per_byte_us = 0.9e-3;  // copies hidden, the bucket cheaper per byte
  EXPECT_EQ(InPlaceCutoff(costs), kNeverInPlace);
}

TEST(CostModelTest, TensorsAsLargeAsABucketGoAlone) {
  AllreduceCosts costs;
  costs.in_place = {7000.0, 1.0e-3, 0};
  costs.fused = {7000.0, 0.9e-3, 0.05};  // fusing never loses by the costs
  ASSERT_EQ(InPlaceCutoff(costs), kNeverInPlace);
  EXPECT_EQ(PlannedInPlaceCutoff(costs, int64_t{16} << 20), int64_t{16} << 20);
  costs.fused.per_byte_us = 1.2e-3;  // alone wins from about 35 MiB, above the cap
  EXPECT_EQ(PlannedInPlaceCutoff(costs, int64_t{16} << 20), int64_t{16} << 20);
  // Shared-memory-like costs cross below the cap: the crossing stands.
  costs.in_place = {20.0, 0.40e-3, 0};
  costs.fused = {25.0, 0.60e-3, 0.05};
  EXPECT_EQ(PlannedInPlaceCutoff(costs, int64_t{4} << 20), 102400);
  // Never below the floor, even for a cap under it.
  EXPECT_EQ(PlannedInPlaceCutoff(costs, 4096), kSmallestInPlace);
}

TEST(CostModelTest, FreeCollectivesGoAloneFromTheFloor) {
  AllreduceCosts costs;
  costs.in_place = {0, 1e-3, 0};
  costs.fused = {5, 2e-3, 0.2};
  EXPECT_EQ(InPlaceCutoff(costs), kSmallestInPlace);
}

TEST(CostModelTest, BytesNoDearerFusedMeansNeverAlone) {
  AllreduceCosts costs;
  costs.in_place = {0, 1e-3, 0};
  costs.fused = {5, 1e-3, 0.2};
  EXPECT_EQ(InPlaceCutoff(costs), kNeverInPlace);
}

TEST(CostModelTest, FitWeighsSmallAndLargeSamplesAlike) {
  // 10 us + 1 ns/B, with the largest sample 10% off: the fixed cost must stay near 10 us, which an
  // unweighted fit would give up to fit the large sample.
  std::vector<CostSample> samples = {{16384, 1, 10 + 16.384},
                                     {262144, 1, 10 + 262.144},
                                     {1 << 20, 1, 10 + 1048.576},
                                     {4 << 20, 1, (10 + 4194.304) * 1.1}};
  const LinearCost fit = FitLinearCost(samples, kFixed | kPerByte);
  EXPECT_GT(fit.fixed_us, 5);
  EXPECT_LT(fit.fixed_us, 15);
}

TEST(CostModelTest, BucketCapKeepsTheFixedCostSmallWithinTheConfiguredMaximum) {
  AllreduceCosts costs;
  // Shared memory: 40 us per bucket, 0.16 ns/B: 5% of a 5 MB bucket; the ladder measured 8 MiB.
  costs.fused = {40.0, 0.16e-3, 0.1};
  EXPECT_EQ(FusedBucketCap(costs, 8 << 20, 64 << 20, 0), 8 << 20);
  // A network: 6 ms per collective at 1.7 ns/B wants 70 MB buckets; 64 MiB is the most allowed.
  costs.fused = {6000.0, 1.7e-3, 0.1};
  EXPECT_EQ(FusedBucketCap(costs, 8 << 20, 64 << 20, 0), 64 << 20);
  // In between: rounded up to whole MiB.
  costs.fused = {500.0, 1.0e-3, 0.1};  // 10 MB
  EXPECT_EQ(FusedBucketCap(costs, 8 << 20, 64 << 20, 0), 10 << 20);
  EXPECT_EQ(FusedBucketCap(costs, 8 << 20, 1 << 20, 0), 1 << 20);
}

TEST(CostModelTest, BucketCapStaysWithinHalfTheLastLevelCache) {
  AllreduceCosts costs;
  // A network that wants 70 MB buckets, on a node with a 32 MiB cache: 16 MiB.
  costs.fused = {6000.0, 1.7e-3, 0.1};
  EXPECT_EQ(FusedBucketCap(costs, 4 << 20, 64 << 20, 32 << 20), 16 << 20);
  // Latency alone measured (no per-byte cost): the same bound.
  costs.fused = {30000.0, 0.0, 0.0};
  EXPECT_EQ(FusedBucketCap(costs, 4 << 20, 64 << 20, 32 << 20), 16 << 20);
  // Never below what calibration measured, nor above the configured maximum.
  EXPECT_EQ(FusedBucketCap(costs, 4 << 20, 64 << 20, 4 << 20), 4 << 20);
  EXPECT_EQ(FusedBucketCap(costs, 4 << 20, 8 << 20, 256 << 20), 8 << 20);
  // Shared memory's small buckets are already within it.
  costs.fused = {40.0, 0.16e-3, 0.1};
  EXPECT_EQ(FusedBucketCap(costs, 8 << 20, 64 << 20, 32 << 20), 8 << 20);
}

TEST(CostModelTest, HierarchicalFromTheCrossover) {
  const LinearCost flat{100.0, 2.0e-3, 0};
  // Its bytes count at 4/3: 200 us / (2.0e-3 - 1.333e-3) = 300000 B, rounded up.
  EXPECT_EQ(HierarchicalFrom(flat, {300.0, 1.0e-3, 0}), 303104);
  EXPECT_EQ(HierarchicalFrom(flat, {50.0, 1.0e-3, 0}), 0);  // cheaper everywhere
  EXPECT_EQ(HierarchicalFrom(flat, {50.0, 2.5e-3, 0}), kNeverInPlace);
  // 20% cheaper per byte is within a ladder's noise across hosts: stay flat.
  EXPECT_EQ(HierarchicalFrom(flat, {50.0, 1.6e-3, 0}), kNeverInPlace);
}

// Across the namespace hosts of docs/benchmarks.md: pieces that stay in a core's cache beat the
// whole probe three times over, and beyond 1 MiB they stop fitting.
TEST(CostModelTest, PiecesChosenWhenFasterByTheMargin) {
  const std::vector<PieceSample> across_hosts = {
      {0, 39155}, {512 << 10, 15772}, {1 << 20, 12035}, {2 << 20, 24488}, {4 << 20, 25047}};
  EXPECT_EQ(ChoosePieceBytes(across_hosts), 1 << 20);
  EXPECT_EQ(DescribePieceChoice(across_hosts, 1 << 20),
            "in pieces of 1 MiB (a 32 MiB allreduce: 12.0 ms so, 39.2 ms whole)");
  // Within the margin, whole allreduces keep each tensor to one collective.
  const std::vector<PieceSample> close = {{0, 10000}, {1 << 20, 9100}, {4 << 20, 9500}};
  EXPECT_EQ(ChoosePieceBytes(close), 0);
  EXPECT_EQ(DescribePieceChoice(close, 0),
            "whole (a 32 MiB allreduce: 10.0 ms whole, 9.1 ms at best in pieces, of 1 MiB)");
  EXPECT_EQ(ChoosePieceBytes({{0, 10000}, {1 << 20, 9000}}), 1 << 20);  // exactly the margin
  // Slower in pieces: whole.
  EXPECT_EQ(ChoosePieceBytes({{0, 5000}, {1 << 20, 8000}, {8 << 20, 5200}}), 0);
  // Equal pieces: the first listed, the smallest.
  EXPECT_EQ(ChoosePieceBytes({{0, 10000}, {1 << 20, 4000}, {2 << 20, 4000}}), 1 << 20);
  // The order of the samples does not matter.
  EXPECT_EQ(ChoosePieceBytes({{4 << 20, 3000}, {0, 10000}, {1 << 20, 5000}}), 4 << 20);
}

TEST(CostModelTest, PiecesNeedAWholeSampleToCompareWith) {
  EXPECT_EQ(ChoosePieceBytes({}), 0);
  EXPECT_EQ(ChoosePieceBytes({{1 << 20, 1000}}), 0);
  EXPECT_EQ(ChoosePieceBytes({{0, 1000}}), 0);
  EXPECT_EQ(DescribePieceChoice({}, 0), "whole (not measured)");
}

TEST(CostModelTest, Descriptions) {
  AllreduceCosts costs;
  costs.in_place = {0, 0.41e-3, 35.2};
  costs.fused = {41.0, 0.52e-3, 0.3};
  EXPECT_EQ(DescribeCosts(costs),
            "alone 0.0 us + 35.20 us/tensor + 0.410 ns/B; fused 41.0 us + 0.30 us/tensor + 0.520 "
            "ns/B");
  EXPECT_EQ(DescribeBytes(512 << 10), "512 KiB");
  EXPECT_EQ(DescribeBytes(3 << 20), "3 MiB");
  EXPECT_EQ(DescribeBytes(100), "100 B");
  EXPECT_EQ(DescribeBytes(kNeverInPlace), "never");
}

}  // namespace
}  // namespace gradsync
