// op=Adasum against a reference that combines every rank's tensors up the same tree in double
// precision, fused and alone, in every floating dtype, with scales, and its refusals. Run at 1, 2
// and 4 ranks.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test/mpi/adasum_reference.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

TEST_F(AdasumTest, FusedAndAloneMatchTheTreeInEveryFloatingDtype) {
  const std::vector<int64_t> sizes{1, 7, 1000, 0, 33, 4099};
  for (DataType dtype :
       {DataType::kFloat64, DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    for (bool grouped : {true, false}) {
      std::vector<std::unique_ptr<HostTensor>> tensors;
      std::vector<TensorView> views;
      std::vector<std::string> names;
      for (size_t t = 0; t < sizes.size(); ++t) {
        tensors.push_back(std::make_unique<HostTensor>(dtype, std::vector<int64_t>{sizes[t]}));
        for (int64_t i = 0; i < sizes[t]; ++i) {
          tensors.back()->Set(i, Input(rank_, static_cast<int>(t), i));
        }
        views.push_back(tensors.back()->view());
        names.push_back("adasum." + DataTypeName(dtype) + "." + std::to_string(grouped) + "." +
                        std::to_string(t));
      }
      std::vector<Handle> handles;
      if (grouped) {
        GroupedAllreduceOptions options;
        options.op = ReduceOp::kAdasum;
        options.names = names;
        handles = grouped_allreduce(views, options);
      } else {
        for (size_t t = 0; t < views.size(); ++t) {
          AllreduceOptions options;
          options.op = ReduceOp::kAdasum;
          options.name = names[t];
          handles.push_back(allreduce(views[t], options));
        }
      }
      for (const Handle& h : handles) ASSERT_TRUE(Succeeds(h));
      for (size_t t = 0; t < sizes.size(); ++t) {
        const Vector want = Reference(size_, static_cast<int>(t), sizes[t]);
        for (int64_t i = 0; i < sizes[t]; ++i) {
          ASSERT_NEAR(tensors[t]->Get(i), want[i], Allowed(dtype) * (1 + std::fabs(want[i])))
              << DataTypeName(dtype) << (grouped ? " grouped" : " alone") << ", tensor " << t
              << ", element " << i;
        }
        EXPECT_TRUE(SameOnEveryRank(tensors[t].get(), DataTypeSize(dtype)));
      }
    }
  }
}

// What Adasum is for: orthogonal gradients add up, equal ones are kept as they are, and a rank
// with nothing (a zero gradient) leaves the others' untouched.
TEST_F(AdasumTest, OrthogonalAddUpEqualStayAndZeroChangesNothing) {
  HostTensor orthogonal(DataType::kFloat64, {8});
  HostTensor equal(DataType::kFloat64, {8});
  HostTensor rank0_only(DataType::kFloat64, {8});
  for (int64_t i = 0; i < 8; ++i) {
    orthogonal.Set(i, i % size_ == rank_ ? i + 1 : 0);
    equal.Set(i, 0.5 * i - 1);
    rank0_only.Set(i, rank_ == 0 ? i * i : 0);
  }
  AllreduceOptions options;
  options.op = ReduceOp::kAdasum;
  for (HostTensor* t : {&orthogonal, &equal, &rank0_only}) {
    ASSERT_TRUE(Succeeds(allreduce(t->view(), options)));
  }
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_DOUBLE_EQ(orthogonal.Get(i), i + 1) << i;
    EXPECT_NEAR(equal.Get(i), 0.5 * i - 1, 1e-12) << i;
    EXPECT_DOUBLE_EQ(rank0_only.Get(i), i * i) << i;
  }
}

// Out of place, host and device tensors: the result lands in the output, the input stays.
TEST_F(AdasumTest, OutOfPlaceLeavesTheInput) {
  for (bool device : {false, true}) {
    HostTensor in(DataType::kFloat64, {77});
    HostTensor out(DataType::kFloat64, {77});
    for (int64_t i = 0; i < in.size(); ++i) in.Set(i, Input(rank_, 4, i));
    AllreduceOptions options;
    options.op = ReduceOp::kAdasum;
    ASSERT_TRUE(
        Succeeds(allreduce(Placed(in.view(), device), Placed(out.view(), device), options)));
    const Vector want = Reference(size_, 4, in.size());
    for (int64_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(in.Get(i), Input(rank_, 4, i)) << i;
      ASSERT_NEAR(out.Get(i), want[i], 1e-12 * (1 + std::fabs(want[i]))) << i;
    }
  }
}

// Adasum is homogeneous: a prescale of 2 doubles the result, and the postscale applies after.
TEST_F(AdasumTest, ScalesApplyBeforeAndAfter) {
  HostTensor t(DataType::kFloat32, {300});
  for (int64_t i = 0; i < t.size(); ++i) t.Set(i, Input(rank_, 3, i));
  AllreduceOptions options;
  options.op = ReduceOp::kAdasum;
  options.prescale = 2.0;
  options.postscale = 0.25;
  ASSERT_TRUE(Succeeds(allreduce(t.view(), options)));
  const Vector want = Reference(size_, 3, t.size(), 2.0);
  for (int64_t i = 0; i < t.size(); ++i) {
    ASSERT_NEAR(t.Get(i), 0.25 * want[i], 1e-5 * (1 + std::fabs(want[i]))) << i;
  }
  // Half precision is scaled in float32: a prescale past float16's range, undone afterwards.
  HostTensor half(DataType::kFloat16, {300});
  for (int64_t i = 0; i < half.size(); ++i) half.Set(i, Input(rank_, 3, i));
  options.prescale = 1e5;
  options.postscale = 1e-5;
  ASSERT_TRUE(Succeeds(allreduce(half.view(), options)));
  const Vector unscaled = Reference(size_, 3, half.size());
  for (int64_t i = 0; i < half.size(); ++i) {
    ASSERT_NEAR(half.Get(i), unscaled[i], 3e-2 * (1 + std::fabs(unscaled[i]))) << i;
  }
}

// A training loop's steps, host and device tensors: the same names every step, which the loop
// locks after a few.
TEST_F(AdasumTest, StepAfterStepNegotiatedAndLocked) {
  const std::vector<int64_t> sizes{40, 3, 700};
  for (bool device : {false, true}) {
    for (int step = 0; step < 8; ++step) {
      std::vector<std::unique_ptr<HostTensor>> grads;
      std::vector<Handle> handles;
      for (size_t t = 0; t < sizes.size(); ++t) {
        grads.push_back(
            std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{sizes[t]}));
        const int seed = static_cast<int>(t) + step;
        for (int64_t i = 0; i < sizes[t]; ++i) grads.back()->Set(i, Input(rank_, seed, i));
        AllreduceOptions options;
        options.op = ReduceOp::kAdasum;
        options.name =
            std::string(device ? "adasum.step.device." : "adasum.step.") + std::to_string(t);
        handles.push_back(allreduce(Placed(grads.back()->view(), device), options));
      }
      for (const Handle& h : handles) ASSERT_TRUE(Succeeds(h)) << "step " << step;
      for (size_t t = 0; t < sizes.size(); ++t) {
        const Vector want = Reference(size_, static_cast<int>(t) + step, sizes[t]);
        for (int64_t i = 0; i < sizes[t]; ++i) {
          ASSERT_NEAR(grads[t]->Get(i), want[i], 1e-5 * (1 + std::fabs(want[i])))
              << (device ? "device" : "host") << ", step " << step << ", tensor " << t
              << ", element " << i;
        }
      }
    }
  }
}

// Small tensors a batch would otherwise bucket together: each is combined as itself.
TEST_F(AdasumTest, ABatchCombinesEachTensorAsItself) {
  const std::vector<int64_t> sizes{16, 5, 64, 1};
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<TensorView> views;
  AllreduceBatchOptions options;
  options.op = ReduceOp::kAdasum;
  for (size_t t = 0; t < sizes.size(); ++t) {
    tensors.push_back(
        std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{sizes[t]}));
    views.push_back(tensors.back()->view());
    options.names.push_back("adasum.batch." + std::to_string(t));
  }
  AllreduceBatch batch(views, options);
  for (int step = 0; step < 3; ++step) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      const int seed = 20 + static_cast<int>(t) + step;
      for (int64_t i = 0; i < sizes[t]; ++i) tensors[t]->Set(i, Input(rank_, seed, i));
      batch.start(t, tensors[t]->data());
    }
    batch.wait();
    for (size_t t = 0; t < sizes.size(); ++t) {
      const Vector want = Reference(size_, 20 + static_cast<int>(t) + step, sizes[t]);
      for (int64_t i = 0; i < sizes[t]; ++i) {
        ASSERT_NEAR(tensors[t]->Get(i), want[i], 1e-5 * (1 + std::fabs(want[i])))
            << "step " << step << ", tensor " << t << ", element " << i;
      }
    }
  }
}

// A joined rank takes part with zeros (a device plane's stand-in holds them in its memory), which
// leave the other side of each pair as it is.
TEST_F(AdasumTest, JoinedRanksLeaveTheOthersResultAsItIs) {
  const int running = std::max(1, size_ / 2);
  for (bool device : {false, true}) {
    HostTensor t(DataType::kFloat64, {90});
    for (int64_t i = 0; i < t.size(); ++i) t.Set(i, Input(rank_, 9, i));
    if (rank_ < running) {
      AllreduceOptions options;
      options.op = ReduceOp::kAdasum;
      options.name = device ? "adasum.joined.device" : "adasum.joined";
      ASSERT_TRUE(Succeeds(allreduce(Placed(t.view(), device), options)));
    }
    join();
    if (rank_ < running) {
      EXPECT_TRUE(IsTreeWithJoined(t, size_, running, 9)) << (device ? "device" : "host");
    }
  }
}

// Enqueue refuses these before any plane sees them, host and device tensors alike.
TEST_F(AdasumTest, RefusesWhatItCannotCombine) {
  AllreduceOptions options;
  options.op = ReduceOp::kAdasum;
  HostTensor ints(DataType::kInt32, {4});
  HostTensor floats(DataType::kFloat32, {4});
  for (bool device : {false, true}) {
    const TensorView ints_view = Placed(ints.view(), device);
    const TensorView floats_view = Placed(floats.view(), device);
    EXPECT_TRUE(ThrowsWith([&] { allreduce(ints_view, options); }, StatusCode::kInvalidArgument,
                           "floating-point"));
    ReducescatterOptions scatter;
    scatter.op = ReduceOp::kAdasum;
    std::unique_ptr<HostTensor> share;
    EXPECT_TRUE(ThrowsWith([&] { reducescatter(floats_view, Into(&share), scatter); },
                           StatusCode::kInvalidArgument, "allreduce op"));
    if (size_ < 4) continue;
    ProcessSet three = add_process_set({0, 1, 2});
    if (three.included()) {
      AllreduceOptions in_three = options;
      in_three.process_set = three;
      EXPECT_TRUE(ThrowsWith([&] { allreduce(floats_view, in_three); },
                             StatusCode::kInvalidArgument, "power-of-two size, not 3"));
    }
    remove_process_set(three);
  }
}

// A process set of two, at 4 ranks: each pair combines its own.
TEST_F(AdasumTest, APowerOfTwoProcessSet) {
  if (size_ < 4) GTEST_SKIP() << "needs 4 ranks";
  ProcessSet pair = add_process_set({1, 3});
  if (pair.included()) {
    HostTensor t(DataType::kFloat64, {50});
    for (int64_t i = 0; i < t.size(); ++i) t.Set(i, Input(rank_, 5, i));
    AllreduceOptions options;
    options.op = ReduceOp::kAdasum;
    options.process_set = pair;
    ASSERT_TRUE(Succeeds(allreduce(t.view(), options)));
    std::vector<Vector> of_rank(2, Vector(50));
    for (int64_t i = 0; i < 50; ++i) {
      of_rank[0][i] = Input(1, 5, i);
      of_rank[1][i] = Input(3, 5, i);
    }
    const Vector want = Tree(of_rank);
    for (int64_t i = 0; i < 50; ++i)
      ASSERT_NEAR(t.Get(i), want[i], 1e-12 * (1 + std::fabs(want[i])));
  }
  remove_process_set(pair);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
