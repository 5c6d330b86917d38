// MeasureInterleaved's order: every strategy runs once a round, and over the rounds each follows
// each other one, so that none always pays for the same neighbour's leftovers.
#include "bench_common.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <set>
#include <utility>
#include <vector>

namespace gradsync_bench {
namespace {

TEST(MeasureInterleavedTest, EveryStrategyRunsOnceARoundAndFollowsEveryOther) {
  constexpr int kStrategies = 4;
  constexpr int kRounds = 60;
  std::vector<int> ran;
  std::vector<Strategy> strategies;
  for (int k = 0; k < kStrategies; ++k) {
    strategies.push_back({"s" + std::to_string(k), [&ran, k] { ran.push_back(k); }});
  }
  const std::vector<double> medians = MeasureInterleaved(strategies, 2, kRounds, MPI_COMM_WORLD);
  ASSERT_EQ(medians.size(), static_cast<size_t>(kStrategies));
  ASSERT_EQ(ran.size(), static_cast<size_t>(kStrategies * (kRounds + 2)));
  std::set<std::pair<int, int>> neighbours;  // (before, after)
  for (size_t i = 0; i < ran.size(); i += kStrategies) {
    const std::set<int> round(ran.begin() + i, ran.begin() + i + kStrategies);
    EXPECT_EQ(round.size(), static_cast<size_t>(kStrategies)) << "round " << i / kStrategies;
  }
  for (size_t i = 1; i < ran.size(); ++i) neighbours.insert({ran[i - 1], ran[i]});
  for (int before = 0; before < kStrategies; ++before) {
    for (int after = 0; after < kStrategies; ++after) {
      if (before != after) {
        EXPECT_TRUE(neighbours.count({before, after})) << after << " never ran after " << before;
      }
    }
  }
}

}  // namespace
}  // namespace gradsync_bench

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int status = RUN_ALL_TESTS();
  MPI_Finalize();
  return status;
}
