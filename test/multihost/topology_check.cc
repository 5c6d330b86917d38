// Run at 2 hosts x 2 ranks (namespace hosts), flat and hierarchical: the topology gradsync reports
// matches the hosts, and allreduces across them, lone and fused, are exact.
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

// Fused buckets of several tensors, under the shared-memory threshold and over it.
TEST_F(MultihostTest, FusedAllreducesAcrossHostsAreExact) {
  for (int64_t n : {int64_t{3}, int64_t{5000}, int64_t{3} << 20}) {
    std::vector<std::vector<float>> tensors = {std::vector<float>(n, rank_ + 1.0f),
                                               std::vector<float>(n + 1, 2.0f * rank_),
                                               std::vector<float>(7, rank_ - 1.0f)};
    GroupedAllreduceOptions options;
    std::vector<TensorView> views;
    for (size_t t = 0; t < tensors.size(); ++t) {
      const auto elements = static_cast<int64_t>(tensors[t].size());
      views.emplace_back(tensors[t].data(), DataType::kFloat32, std::vector<int64_t>{elements});
      options.names.push_back("multihost.group." + std::to_string(n) + "." + std::to_string(t));
    }
    for (const Handle& handle : grouped_allreduce(views, options)) ASSERT_TRUE(Succeeds(handle));
    EXPECT_EQ(tensors[0].back(), size_ * (size_ + 1) / 2);
    EXPECT_EQ(tensors[1].front(), size_ * (size_ - 1));
    EXPECT_EQ(tensors[2].back(), size_ * (size_ - 3) / 2);
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
