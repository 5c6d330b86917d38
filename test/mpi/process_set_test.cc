// Process sets: disjoint sets running side by side with the same tensor names, every collective
// inside a set (ranks numbered within it), sets declared at init, added and removed at run time,
// and the errors: a rank outside the set, a removed set, disagreeing or invalid member lists, and
// mismatches that name global ranks.
#include <algorithm>
#include <memory>
#include <thread>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

class ProcessSetTest : public MultiRankTest {
 protected:
  // Even ranks and odd ranks: two disjoint sets that together cover every rank.
  std::vector<int> Parity(int parity) const {
    std::vector<int> ranks;
    for (int r = parity; r < size_; r += 2) ranks.push_back(r);
    return ranks;
  }
};

AllreduceOptions InSet(const std::string& name, const ProcessSet& set) {
  AllreduceOptions options;
  options.name = name;
  options.process_set = set;
  return options;
}

TEST_F(ProcessSetTest, GlobalSetIsAlwaysThere) {
  const std::vector<ProcessSet> sets = process_sets();
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0].id(), 0);
  EXPECT_EQ(sets[0], ProcessSet());
  EXPECT_EQ(sets[0].size(), size_);
  EXPECT_EQ(sets[0].rank(), rank_);
  EXPECT_TRUE(sets[0].included());
  EXPECT_TRUE(ThrowsWith([] { remove_process_set(ProcessSet()); }, StatusCode::kInvalidArgument,
                         "global process set (id 0) cannot be removed"));
}

TEST_F(ProcessSetTest, DisjointSetsRunSideBySideWithTheSameNames) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  const ProcessSet even = add_process_set(Parity(0));
  const ProcessSet odd = add_process_set(Parity(1));
  EXPECT_EQ(even.id(), 1);
  EXPECT_EQ(odd.id(), 2);
  const ProcessSet& mine = rank_ % 2 == 0 ? even : odd;
  const std::vector<int> members = Parity(rank_ % 2);
  EXPECT_EQ(mine.ranks(), members);
  EXPECT_EQ(mine.rank(), rank_ / 2);
  EXPECT_FALSE((rank_ % 2 == 0 ? odd : even).included());

  double expected = 0;
  for (int r : members) expected += r + 1;
  // Many steps of the same names in both sets: the second step on goes through each set's cache.
  // One set is slowed down so that the two are out of step with each other.
  for (int step = 0; step < 20; ++step) {
    if (rank_ % 2 == 1 && step % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<Handle> handles;
    for (int t = 0; t < 8; ++t) {
      tensors.push_back(std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{3}));
      for (int i = 0; i < 3; ++i) tensors.back()->Set(i, (rank_ + 1) * (t + 1));
      handles.push_back(
          allreduce(tensors.back()->view(), InSet("ps.grad." + std::to_string(t), mine)));
    }
    for (const Handle& h : handles) ASSERT_TRUE(Succeeds(h));
    for (int t = 0; t < 8; ++t) {
      for (int i = 0; i < 3; ++i)
        ASSERT_EQ(tensors[t]->Get(i), expected * (t + 1)) << "step " << step;
    }
  }
  // The global set still works alongside.
  HostTensor all(DataType::kInt32, {1});
  all.Set(0, 1);
  ASSERT_TRUE(Succeeds(allreduce(all.view(), InSet("ps.global", ProcessSet()))));
  EXPECT_EQ(all.Get(0), size_);
  remove_process_set(even);
  remove_process_set(odd);
  EXPECT_EQ(process_sets().size(), 1u);
}

TEST_F(ProcessSetTest, EveryCollectiveUsesRanksWithinTheSet) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  // The ranks above 0: set ranks differ from global ranks by one.
  std::vector<int> upper;
  for (int r = 1; r < size_; ++r) upper.push_back(r);
  const ProcessSet set = add_process_set(upper);
  if (!set.included()) {
    EXPECT_EQ(set.rank(), -1);
    HostTensor t(DataType::kFloat32, {1});
    EXPECT_TRUE(ThrowsWith([&] { allreduce(t.view(), InSet("ps.outside", set)); },
                           StatusCode::kInvalidArgument,
                           "not a member of process set " + std::to_string(set.id())));
    std::unique_ptr<HostTensor> out;
    AllgatherOptions gather;
    gather.process_set = set;
    EXPECT_TRUE(ThrowsWith([&] { allgather(t.view(), Into(&out), gather); },
                           StatusCode::kInvalidArgument, "ranks " + std::to_string(1)));
    remove_process_set(set);
    return;
  }
  const int n = set.size();
  const int me = set.rank();
  ASSERT_EQ(me, rank_ - 1);

  // Allgather: rank i of the set contributes i + 1 rows of value i, in set-rank order.
  HostTensor rows(DataType::kInt32, {me + 1});
  for (int i = 0; i <= me; ++i) rows.Set(i, me);
  std::unique_ptr<HostTensor> gathered;
  AllgatherOptions gather;
  gather.name = "ps.gather";
  gather.process_set = set;
  Handle hg = allgather(rows.view(), Into(&gathered), gather);

  // Broadcast from set rank 0, named by its global rank 1 as every root is (Horovod's way).
  HostTensor b(DataType::kFloat64, {2});
  b.Set(0, rank_ == 1 ? 42 : -1);
  b.Set(1, rank_ == 1 ? 43 : -1);
  BroadcastOptions bcast;
  bcast.name = "ps.bcast";
  bcast.process_set = set;
  Handle hb = broadcast(b.view(), 1, bcast);

  // Reducescatter of n + 1 rows: set rank 0 takes two.
  HostTensor rs_in(DataType::kFloat32, {n + 1});
  for (int i = 0; i <= n; ++i) rs_in.Set(i, i);
  std::unique_ptr<HostTensor> rs_out;
  ReducescatterOptions rs;
  rs.name = "ps.rs";
  rs.process_set = set;
  Handle hr = reducescatter(rs_in.view(), Into(&rs_out), rs);

  // Alltoall: one row to each set member, tagged with sender and receiver.
  HostTensor a_in(DataType::kInt32, {n});
  for (int d = 0; d < n; ++d) a_in.Set(d, me * 10 + d);
  std::unique_ptr<HostTensor> a_out;
  AlltoallOptions a2a;
  a2a.name = "ps.a2a";
  a2a.process_set = set;
  Handle ha = alltoall(a_in.view(), Into(&a_out), a2a);
  Handle hbar = barrier("ps.barrier", set);

  // A grouped allreduce in the set: sums over the set's members only.
  std::vector<std::unique_ptr<HostTensor>> members;
  std::vector<TensorView> member_views;
  GroupedAllreduceOptions grouped;
  grouped.process_set = set;
  for (int t = 0; t < 5; ++t) {
    members.push_back(std::make_unique<HostTensor>(DataType::kInt32, std::vector<int64_t>{2}));
    members.back()->Set(0, rank_);
    members.back()->Set(1, t);
    member_views.push_back(members.back()->view());
    grouped.names.push_back("ps.group." + std::to_string(t));
  }
  const std::vector<Handle> group_handles = grouped_allreduce(member_views, grouped);

  ASSERT_TRUE(Succeeds(hg));
  std::vector<double> want_gather;
  for (int i = 0; i < n; ++i) want_gather.insert(want_gather.end(), i + 1, i);
  ASSERT_EQ(gathered->size(), static_cast<int64_t>(want_gather.size()));
  for (size_t i = 0; i < want_gather.size(); ++i) EXPECT_EQ(gathered->Get(i), want_gather[i]);

  ASSERT_TRUE(Succeeds(hb));
  EXPECT_EQ(b.Get(0), 42);
  EXPECT_EQ(b.Get(1), 43);

  ASSERT_TRUE(Succeeds(hr));
  const int first = me == 0 ? 0 : me + 1;
  ASSERT_EQ(rs_out->size(), me == 0 ? 2 : 1);
  for (int64_t i = 0; i < rs_out->size(); ++i) EXPECT_EQ(rs_out->Get(i), (first + i) * n);

  ASSERT_TRUE(Succeeds(ha));
  ASSERT_EQ(a_out->size(), n);
  for (int s = 0; s < n; ++s) EXPECT_EQ(a_out->Get(s), s * 10 + me);
  EXPECT_EQ(ha.received_splits(), std::vector<int64_t>(n, 1));
  ASSERT_TRUE(Succeeds(hbar));
  int rank_sum = 0;
  for (int r : set.ranks()) rank_sum += r;
  for (int t = 0; t < 5; ++t) {
    ASSERT_TRUE(Succeeds(group_handles[t]));
    EXPECT_EQ(members[t]->Get(0), rank_sum);
    EXPECT_EQ(members[t]->Get(1), t * n);
  }

  // A root must be a member (global rank 0 is not), and splits are checked against the set's
  // size, not the world's.
  HostTensor t(DataType::kFloat32, {1});
  EXPECT_TRUE(ThrowsWith([&] { broadcast(t.view(), 0, bcast); }, StatusCode::kInvalidArgument,
                         "root rank 0 is not a member of process set"));
  EXPECT_TRUE(ThrowsWith([&] { broadcast(t.view(), size_, bcast); }, StatusCode::kInvalidArgument,
                         "is outside [0, " + std::to_string(size_)));
  a2a.splits = std::vector<int64_t>(size_, 0);
  EXPECT_TRUE(ThrowsWith([&] { alltoall(a_in.view(), Into(&a_out), a2a); },
                         StatusCode::kInvalidArgument,
                         std::to_string(size_) + " splits for " + std::to_string(n) + " ranks"));
  remove_process_set(set);
}

TEST_F(ProcessSetTest, MismatchInASetNamesGlobalRanks) {
  if (size_ < 3) GTEST_SKIP() << "needs three ranks";
  const ProcessSet set = add_process_set({1, 2});
  if (set.included()) {
    HostTensor t(rank_ == 1 ? DataType::kFloat32 : DataType::kInt32, {2});
    EXPECT_TRUE(FailsWith(allreduce(t.view(), InSet("ps.mismatch", set)), StatusCode::kMismatch,
                          "rank 1 has float32; rank 2 has int32"));
    HostTensor ok(DataType::kFloat32, {2});
    ok.Set(0, 1);
    ASSERT_TRUE(Succeeds(allreduce(ok.view(), InSet("ps.after", set))));
    EXPECT_EQ(ok.Get(0), 2);
  }
  remove_process_set(set);
}

TEST_F(ProcessSetTest, AddedAndRemovedAtRunTime) {
  std::vector<int> first_two = {0};
  if (size_ > 1) first_two.push_back(1);
  if (size_ == static_cast<int>(first_two.size())) {
    // Every rank: the same members as the global set.
    EXPECT_TRUE(ThrowsWith([&] { add_process_set(first_two); }, StatusCode::kInvalidArgument,
                           "process set 0 already has exactly ranks"));
    return;
  }
  const ProcessSet set = add_process_set({first_two.rbegin(), first_two.rend()});  // any order
  EXPECT_EQ(set.ranks(), first_two);
  EXPECT_TRUE(ThrowsWith([&] { add_process_set(first_two); }, StatusCode::kInvalidArgument,
                         "already has exactly ranks"));
  HostTensor t(DataType::kFloat32, {1});
  t.Set(0, 1);
  if (set.included()) {
    ASSERT_TRUE(Succeeds(allreduce(t.view(), InSet("ps.live", set))));
    EXPECT_EQ(t.Get(0), static_cast<double>(first_two.size()));
  }
  remove_process_set(set);
  EXPECT_TRUE(ThrowsWith([&] { allreduce(t.view(), InSet("ps.gone", set)); },
                         StatusCode::kInvalidArgument, "does not exist"));
  EXPECT_TRUE(ThrowsWith([&] { set.ranks(); }, StatusCode::kInvalidArgument, "does not exist"));
  EXPECT_TRUE(
      ThrowsWith([&] { remove_process_set(set); }, StatusCode::kInvalidArgument, "does not exist"));
  // The same members again: a new set under a new id.
  const ProcessSet again = add_process_set(first_two);
  EXPECT_GT(again.id(), set.id());
  remove_process_set(again);
}

TEST_F(ProcessSetTest, BadMemberListsFailOnEveryRank) {
  EXPECT_TRUE(
      ThrowsWith([] { add_process_set({}); }, StatusCode::kInvalidArgument, "at least one rank"));
  EXPECT_TRUE(ThrowsWith([&] { add_process_set({size_}); }, StatusCode::kInvalidArgument,
                         "is outside [0, " + std::to_string(size_) + ")"));
  EXPECT_TRUE(ThrowsWith(
      [] {
        add_process_set({0, 0});
      },
      StatusCode::kInvalidArgument, "rank 0 is listed twice"));
  EXPECT_EQ(process_sets().size(), 1u);
  // gradsync's own operations are named "gradsync.*"; a tensor may not pose as one.
  HostTensor t(DataType::kFloat32, {1});
  EXPECT_TRUE(ThrowsWith([&] { allreduce(t.view(), InSet("gradsync.join", ProcessSet())); },
                         StatusCode::kInvalidArgument, "reserved"));
  if (size_ < 2) return;
  // A bad list on one rank only fails on every rank instead of stalling the others.
  std::vector<int> mine = {0};
  if (rank_ == 1) mine.push_back(size_);
  EXPECT_TRUE(ThrowsWith([&] { add_process_set(mine); }, StatusCode::kMismatch, "ranks disagree"));
  // The calls stay paired up afterwards.
  remove_process_set(add_process_set({0}));
}

TEST_F(ProcessSetTest, RanksThatDisagreeAllFail) {
  if (size_ < 3) GTEST_SKIP() << "needs three ranks";
  const std::vector<int> mine = rank_ == 0 ? std::vector<int>{0, 1} : std::vector<int>{0, 2};
  EXPECT_TRUE(ThrowsWith([&] { add_process_set(mine); }, StatusCode::kMismatch,
                         "rank 0 passed [0, 1]; ranks 1, 2"));
  EXPECT_EQ(process_sets().size(), 1u);
  // Later calls agree again.
  remove_process_set(add_process_set({0, 2}));
}

TEST_F(ProcessSetTest, RemovingFailsPendingOperations) {
  if (size_ < 3) GTEST_SKIP() << "needs three ranks (two set members and one outside)";
  const ProcessSet set = add_process_set({0, 1});
  HostTensor t(DataType::kFloat32, {1});
  Handle pending;
  // Only set rank 0 submits it, so it waits until the set goes away.
  if (rank_ == 0) pending = allreduce(t.view(), InSet("ps.orphan", set));
  remove_process_set(set);
  if (rank_ == 0) {
    EXPECT_TRUE(FailsWith(pending, StatusCode::kShutdown,
                          "process set " + std::to_string(set.id()) + " was removed"));
  }
}

TEST_F(ProcessSetTest, DeclaredAtInit) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  shutdown();
  InitOptions options;
  options.process_sets = {{0}, {size_ - 1}};
  init(options);
  const std::vector<ProcessSet> sets = process_sets();
  ASSERT_EQ(sets.size(), 3u);
  EXPECT_EQ(sets[1].ranks(), std::vector<int>{0});
  EXPECT_EQ(sets[2].ranks(), std::vector<int>{size_ - 1});
  for (const ProcessSet& set : {sets[1], sets[2]}) {
    if (!set.included()) continue;
    HostTensor t(DataType::kInt64, {2});
    t.Set(1, 7);
    ASSERT_TRUE(Succeeds(allreduce(t.view(), InSet("ps.init." + std::to_string(set.id()), set))));
    EXPECT_EQ(t.Get(1), 7);
  }
  // Ranks outside both sets must not shut down while the members still run.
  ASSERT_TRUE(Succeeds(barrier("ps.init.done")));
}

TEST_F(ProcessSetTest, InitRefusesBadOrDisagreeingDeclarations) {
  shutdown();
  InitOptions bad;
  bad.process_sets = {{0, size_}};
  EXPECT_TRUE(ThrowsWith(
      [&] { init(bad); }, StatusCode::kInvalidArgument,
      "process set 0 of InitOptions::process_sets: rank " + std::to_string(size_) + " is outside"));
  EXPECT_FALSE(is_initialized());
  if (size_ > 1) {
    InitOptions differ;
    differ.process_sets = {{rank_ == 0 ? 0 : 1}};
    EXPECT_TRUE(ThrowsWith([&] { init(differ); }, StatusCode::kMismatch, "ranks disagree"));
    EXPECT_FALSE(is_initialized());
  }
  init();
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
