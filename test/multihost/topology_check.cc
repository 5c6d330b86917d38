// Run at 2 hosts x 2 ranks (namespace hosts): the topology gradsync reports matches the hosts,
// and allreduces across them are exact.
#include <unistd.h>

#include <string>
#include <vector>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

class MultihostTest : public MultiRankTest {};

TEST_F(MultihostTest, TopologyFollowsTheHosts) {
  ASSERT_EQ(size_ % 2, 0);
  // mpirun fills each host's slots in turn: ranks 0 and 1 on the first host, 2 and 3 on the next.
  EXPECT_EQ(local_size(), 2);
  EXPECT_EQ(local_rank(), rank_ % 2);
  EXPECT_EQ(cross_size(), size_ / 2);
  EXPECT_EQ(cross_rank(), rank_ / 2);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(std::string(host), "gs-h" + std::to_string(rank_ / 2));
}

TEST_F(MultihostTest, AllreducesAcrossHostsAreExact) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
    std::vector<double> data(n, rank_ + 1);
    AllreduceOptions options;
    options.name = "multihost." + std::to_string(n);
    ASSERT_TRUE(Succeeds(allreduce(TensorView(data.data(), DataType::kFloat64, {n}), options)));
    EXPECT_EQ(data.front(), size_ * (size_ + 1) / 2);
    EXPECT_EQ(data.back(), size_ * (size_ + 1) / 2);
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
