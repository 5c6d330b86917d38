#include "runtime/mpi_context.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

TEST(CoresPerRankTest, UnboundRanksShareTheNodeEvenly) {
  EXPECT_EQ(CoresPerRank(96, 96, 8), 12);
  EXPECT_EQ(CoresPerRank(2, 2, 1), 2);
  // Two ranks on a two-core node: each rank's threads share one core.
  EXPECT_EQ(CoresPerRank(2, 2, 2), 1);
  EXPECT_EQ(CoresPerRank(2, 2, 4), 1);  // oversubscribed: still at least one
}

TEST(CoresPerRankTest, BoundRanksCountTheirOwnCpus) {
  EXPECT_EQ(CoresPerRank(1, 96, 8), 1);  // bound to one core: no core to spare
  EXPECT_EQ(CoresPerRank(4, 96, 8), 4);
  EXPECT_EQ(CoresPerRank(24, 96, 8), 12);  // overlapping bindings: the even share
}

TEST(CoresPerRankTest, NonsenseInputsGiveOne) {
  EXPECT_EQ(CoresPerRank(0, 0, 0), 1);
  EXPECT_EQ(CoresPerRank(8, 8, 0), 8);
  EXPECT_EQ(CoresPerRank(-1, 8, 1), 1);
}

}  // namespace
}  // namespace gradsync
