// Grouped allreduce, allgather and reducescatter: results, a group completing in one cycle through
// the full round and through the cache, and atomic refusal of a group with a bad member.
#include <memory>
#include <thread>

#include "ops/data_plane.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

class GroupedTest : public MultiRankTest {};

std::vector<std::string> Names(const std::string& prefix, int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(prefix + std::to_string(i));
  return names;
}

// The members of one small group share a bucket and so complete in one step: once the first is
// done, every other one is done too. A group split over cycles would leave later members pending.
::testing::AssertionResult CompletedTogether(const std::vector<Handle>& handles) {
  if (handles.empty()) return ::testing::AssertionSuccess();
  const ::testing::AssertionResult first = Succeeds(handles.front());
  if (!first) return first;
  for (size_t i = 1; i < handles.size(); ++i) {
    if (!handles[i].poll()) {
      return ::testing::AssertionFailure() << "member " << i << " still pending after member 0";
    }
  }
  for (const Handle& h : handles) {
    const ::testing::AssertionResult ok = Succeeds(h);
    if (!ok) return ok;
  }
  return ::testing::AssertionSuccess();
}

TEST_F(GroupedTest, ManyTensorsCompleteInOneCycleAndSumCorrectly) {
  constexpr int kMembers = 300;
  for (int step = 0; step < 3; ++step) {  // step 0 negotiates in full, later steps hit the cache
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<TensorView> views;
    for (int t = 0; t < kMembers; ++t) {
      tensors.push_back(
          std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{1 + t % 13}));
      for (int64_t i = 0; i < tensors.back()->size(); ++i) {
        tensors.back()->Set(i, Value(ReduceOp::kSum, rank_, i + t));
      }
      views.push_back(tensors.back()->view());
    }
    // Lone tensors around the group, enqueued at different moments on different ranks, must not
    // pull part of the group into another cycle.
    HostTensor before(DataType::kFloat32, {5}), after(DataType::kFloat32, {5});
    AllreduceOptions lone;
    lone.name = "lone.before";
    Handle h_before = allreduce(before.view(), lone);
    if (rank_ % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    GroupedAllreduceOptions options;
    options.names = Names("grp.", kMembers);
    std::vector<Handle> handles = grouped_allreduce(views, options);
    lone.name = "lone.after";
    Handle h_after = allreduce(after.view(), lone);
    ASSERT_EQ(handles.size(), static_cast<size_t>(kMembers));
    ASSERT_TRUE(CompletedTogether(handles)) << "step " << step;
    ASSERT_TRUE(Succeeds(h_before));
    ASSERT_TRUE(Succeeds(h_after));
    for (int t = 0; t < kMembers; ++t) {
      for (int64_t i = 0; i < tensors[t]->size(); ++i) {
        ASSERT_EQ(tensors[t]->Get(i), Expected(ReduceOp::kSum, DataType::kFloat32, size_, i + t))
            << "tensor " << t << " element " << i;
      }
    }
  }
}

TEST_F(GroupedTest, AllgatherAndReducescatterGroups) {
  constexpr int kMembers = 6;
  std::vector<std::unique_ptr<HostTensor>> inputs;
  std::vector<TensorView> views;
  auto outputs = std::make_shared<std::vector<std::unique_ptr<HostTensor>>>(kMembers);
  std::vector<Allocator> allocators;
  for (int t = 0; t < kMembers; ++t) {
    // Member t has rank_ + t rows on this rank, each of 2 elements tagged with rank and member.
    inputs.push_back(
        std::make_unique<HostTensor>(DataType::kInt32, std::vector<int64_t>{rank_ + t, 2}));
    for (int64_t i = 0; i < inputs.back()->size(); ++i) inputs.back()->Set(i, rank_ * 10 + t);
    views.push_back(inputs.back()->view());
    allocators.push_back([outputs, t](const std::vector<int64_t>& shape, DataType dtype) {
      (*outputs)[t] = std::make_unique<HostTensor>(dtype, shape);
      return (*outputs)[t]->data();
    });
  }
  GroupedAllgatherOptions gather_options;
  gather_options.names = Names("gather.", kMembers);
  std::vector<Handle> gathered = grouped_allgather(views, allocators, gather_options);
  // Allgathers do not fuse: each member is its own collective, so they finish one by one.
  for (const Handle& h : gathered) ASSERT_TRUE(Succeeds(h));
  for (int t = 0; t < kMembers; ++t) {
    int64_t at = 0;
    for (int r = 0; r < size_; ++r) {
      for (int64_t i = 0; i < (r + t) * 2; ++i) ASSERT_EQ((*outputs)[t]->Get(at++), r * 10 + t);
    }
  }

  // Reducescatter needs the same shape everywhere: 7 + t rows on every rank.
  std::vector<std::unique_ptr<HostTensor>> same;
  std::vector<TensorView> same_views;
  for (int t = 0; t < kMembers; ++t) {
    same.push_back(std::make_unique<HostTensor>(DataType::kInt32, std::vector<int64_t>{7 + t, 2}));
    for (int64_t i = 0; i < same.back()->size(); ++i) same.back()->Set(i, rank_ + i);
    same_views.push_back(same.back()->view());
  }
  GroupedReducescatterOptions scatter_options;
  scatter_options.names = Names("scatter.", kMembers);
  std::vector<Handle> scattered = grouped_reducescatter(same_views, allocators, scatter_options);
  ASSERT_TRUE(CompletedTogether(scattered));
  const int rank_sum = size_ * (size_ - 1) / 2;
  for (int t = 0; t < kMembers; ++t) {
    const std::vector<int64_t> rows = EvenSplits(7 + t, size_);
    int64_t first = 0;
    for (int r = 0; r < rank_; ++r) first += rows[r];
    ASSERT_EQ(scattered[t].output_shape(), (std::vector<int64_t>{rows[rank_], 2}));
    for (int64_t i = 0; i < rows[rank_] * 2; ++i) {
      ASSERT_EQ((*outputs)[t]->Get(i), rank_sum + size_ * (first * 2 + i));
    }
  }
}

TEST_F(GroupedTest, AGroupWithABadMemberIsRefusedWhole) {
  HostTensor good(DataType::kFloat32, {3});
  TensorView bad(nullptr, DataType::kFloat32, {4});
  GroupedAllreduceOptions options;
  options.names = {"whole.a", "whole.b"};
  EXPECT_TRUE(ThrowsWith(
      [&] {
        grouped_allreduce({good.view(), bad}, options);
      },
      StatusCode::kInvalidArgument, "whole.b"));
  // Nothing was enqueued: the names are free, and every rank can run the group.
  HostTensor other(DataType::kFloat32, {4});
  std::vector<Handle> handles = grouped_allreduce({good.view(), other.view()}, options);
  EXPECT_TRUE(CompletedTogether(handles));

  options.names = {"only.one"};
  EXPECT_TRUE(ThrowsWith(
      [&] {
        grouped_allreduce({good.view(), other.view()}, options);
      },
      StatusCode::kInvalidArgument, "1 names for 2 tensors"));
  EXPECT_TRUE(ThrowsWith([&] { grouped_allgather({good.view()}, {}); },
                         StatusCode::kInvalidArgument, "0 allocators for 1 tensors"));
  EXPECT_TRUE(grouped_allreduce({}).empty());
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
