// join(): ranks with uneven step counts. Joined ranks take part in the others' allreduces with the
// identity of the reduce op (through the full round even for cached tensors), barriers still
// complete, the collectives that cannot be joined fail on every rank, and join() returns the last
// rank to join, the same everywhere.
#include <memory>
#include <numeric>
#include <thread>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

class JoinTest : public MultiRankTest {
 protected:
  // The same join result on every rank.
  void ExpectAgreedOnEveryRank(int last) {
    int low = 0, high = 0;
    MPI_Allreduce(&last, &low, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&last, &high, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(low, high);
  }
};

AllreduceOptions Named(const std::string& name, ReduceOp op) {
  AllreduceOptions options;
  options.name = name;
  options.op = op;
  return options;
}

// Rank r runs 2 + 2r steps, then joins. At each step, the ranks still running reduce their values
// (rank + 1) with every op and dtype; the joined ranks must change nothing but the average's
// divisor, which stays the number of all ranks.
TEST_F(JoinTest, UnevenStepsReduceOverTheRanksStillRunning) {
  const int my_steps = 2 + 2 * rank_;
  const std::vector<DataType> dtypes = {DataType::kFloat32,  DataType::kInt32,   DataType::kFloat16,
                                        DataType::kBFloat16, DataType::kFloat64, DataType::kInt64};
  for (int step = 0; step < my_steps; ++step) {
    std::vector<int> running;
    for (int r = 0; r < size_; ++r) {
      if (2 + 2 * r > step) running.push_back(r);
    }
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<Handle> handles;
    std::vector<std::pair<ReduceOp, DataType>> cases;
    for (ReduceOp op : kAllReduceOps) {
      for (DataType dtype : dtypes) {
        tensors.push_back(std::make_unique<HostTensor>(dtype, std::vector<int64_t>{5}));
        for (int i = 0; i < 5; ++i) tensors.back()->Set(i, rank_ + 1);
        // The same names every step: from step 1 they are cached, and a joined rank sets no
        // cache bits, so they must go through the full round.
        const std::string name =
            "join." + ReduceOpName(op) + "." + DataTypeName(dtype) + "." + std::to_string(step % 2);
        handles.push_back(allreduce(tensors.back()->view(), Named(name, op)));
        cases.push_back({op, dtype});
      }
    }
    for (size_t c = 0; c < cases.size(); ++c) {
      ASSERT_TRUE(Succeeds(handles[c])) << "step " << step;
      double want = 0;
      switch (cases[c].first) {
        case ReduceOp::kSum:
          for (int r : running) want += r + 1;
          break;
        case ReduceOp::kAverage:
          for (int r : running) want += r + 1;
          want /= size_;
          break;
        case ReduceOp::kMin:
          want = running.front() + 1;
          break;
        case ReduceOp::kMax:
          want = running.back() + 1;
          break;
        case ReduceOp::kProduct:
          want = 1;
          for (int r : running) want *= r + 1;
          break;
        case ReduceOp::kAdasum:  // not among the cases (adasum_test has its joined ranks)
          break;
      }
      if (cases[c].second == DataType::kInt32 || cases[c].second == DataType::kInt64) {
        want = static_cast<double>(static_cast<int64_t>(want));  // integer average truncates
      }
      for (int i = 0; i < 5; ++i) {
        EXPECT_NEAR(tensors[c]->Get(i), want, Tolerance(cases[c].second, want))
            << ReduceOpName(cases[c].first) << " " << DataTypeName(cases[c].second) << " step "
            << step;
      }
    }
  }
  const int last = join();
  EXPECT_EQ(last, size_ - 1);  // the rank with the most steps
  ExpectAgreedOnEveryRank(last);
  // Everyone is back: a normal allreduce over all ranks, and a second join round.
  HostTensor t(DataType::kFloat32, {1});
  t.Set(0, 1);
  ASSERT_TRUE(Succeeds(allreduce(t.view(), Named("join.after", ReduceOp::kSum))));
  EXPECT_EQ(t.Get(0), size_);
  ExpectAgreedOnEveryRank(join());
}

TEST_F(JoinTest, CollectivesThatCannotJoinFailWhileARankHasJoined) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  int last = -1;
  if (rank_ == 0) {
    last = join();
  } else {
    HostTensor t(DataType::kFloat32, {2, 1});
    std::unique_ptr<HostTensor> out;
    AllgatherOptions gather;
    gather.name = "join.gather";
    EXPECT_TRUE(FailsWith(allgather(t.view(), Into(&out), gather), StatusCode::kMismatch,
                          "cannot run while rank 0 has joined"));
    BroadcastOptions bcast;
    bcast.name = "join.bcast";
    EXPECT_TRUE(FailsWith(broadcast(t.view(), 1, bcast), StatusCode::kMismatch,
                          "broadcast of tensor 'join.bcast' cannot run"));
    ReducescatterOptions rs;
    rs.name = "join.rs";
    EXPECT_TRUE(FailsWith(reducescatter(t.view(), Into(&out), rs), StatusCode::kMismatch,
                          "cannot run while rank 0 has joined"));
    AlltoallOptions a2a;
    a2a.name = "join.a2a";
    HostTensor rows(DataType::kFloat32, {size_ - 1});
    a2a.splits.assign(size_, 1);
    a2a.splits[0] = 0;
    EXPECT_TRUE(FailsWith(alltoall(rows.view(), Into(&out), a2a), StatusCode::kMismatch,
                          "only allreduce and barrier run alongside join()"));
    ASSERT_TRUE(Succeeds(barrier("join.barrier")));
    t.Set(0, 2);
    ASSERT_TRUE(Succeeds(allreduce(t.view(), Named("join.sum", ReduceOp::kSum))));
    EXPECT_EQ(t.Get(0), 2 * (size_ - 1));
    last = join();
  }
  EXPECT_GE(last, 1);
  ExpectAgreedOnEveryRank(last);
}

// Three tensors of 7 floats, averaged by a batch whose names begin with `prefix`; each step every
// rank starts them holding its rank + 1.
struct AveragedBatch {
  explicit AveragedBatch(const std::string& prefix) {
    options.op = ReduceOp::kAverage;
    for (int t = 0; t < 3; ++t) {
      tensors.push_back(std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{7}));
      specs.push_back(tensors.back()->view());
      options.names.push_back(prefix + std::to_string(t));
    }
  }
  void Start(AllreduceBatch& batch, int rank) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (int i = 0; i < 7; ++i) tensors[t]->Set(i, rank + 1);
      batch.start(t, tensors[t]->view().data);
    }
  }
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<TensorView> specs;
  AllreduceBatchOptions options;
};

// A batch whose last bucket its callers reduce: rank r runs 2 + 2r steps, then joins. The first
// rank to join takes part once in the others' reduction (with zeros), which hands the bucket back
// to negotiation, where its stand-ins take part until everyone has joined; then the callers
// reduce it again.
TEST_F(JoinTest, ABatchReducedByItsCallersJoinsToo) {
  AveragedBatch averaged("join.batch.");
  std::vector<std::unique_ptr<HostTensor>>& tensors = averaged.tensors;
  AllreduceBatch batch(averaged.specs, averaged.options);
  auto run_step = [&](const std::vector<int>& running, const std::string& where) {
    averaged.Start(batch, rank_);
    batch.wait();
    double want = 0;
    for (int r : running) want += r + 1;
    want /= size_;
    for (auto& tensor : tensors) ASSERT_NEAR(tensor->Get(6), want, 1e-5) << where;
  };
  const int my_steps = 2 + 2 * rank_;
  for (int step = 0; step < my_steps; ++step) {
    std::vector<int> running;
    for (int r = 0; r < size_; ++r) {
      if (2 + 2 * r > step) running.push_back(r);
    }
    run_step(running, "step " + std::to_string(step));
  }
  const uint64_t before_join = batch.caller_reductions();
  ExpectAgreedOnEveryRank(join());
  std::vector<int> everyone(size_);
  std::iota(everyone.begin(), everyone.end(), 0);
  for (int step = 0; step < 3; ++step) run_step(everyone, "after join " + std::to_string(step));
  // Negotiated once more after the join, then reduced by the callers.
  EXPECT_EQ(batch.caller_reductions() - before_join, CallerReduces(size_) ? 2u : 0u);
}

// A rank whose batch goes before it joins (a batch scoped to its loop, a rank whose data ran out
// first) leaves the others' buckets negotiated: the question that grants a bucket a lane is a
// collective, which the joined rank, without the batch, would not have taken part in (the others'
// next allreduce then paired with its next collective).
TEST_F(JoinTest, ABatchGoneBeforeItsRankJoinsLeavesTheOthersNegotiating) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  AveragedBatch averaged("join.scoped.batch.");
  {
    AllreduceBatch batch(averaged.specs, averaged.options);
    for (int step = 0; rank_ != 0 && step < 3; ++step) {
      averaged.Start(batch, rank_);
      batch.wait();
      double want = 0;
      for (int r = 1; r < size_; ++r) want += r + 1;
      want /= size_;
      for (auto& tensor : averaged.tensors) {
        ASSERT_NEAR(tensor->Get(6), want, 1e-5) << "step " << step;
      }
    }
  }  // rank 0's goes before any step
  ExpectAgreedOnEveryRank(join());
}

// A joined rank's stand-in is scaled by the prescale like every contribution: under a negative
// factor min's +inf would become -inf (and max's -inf +inf), so it must contribute the other
// extreme; a product's 1 cannot survive a factor, so that allreduce fails on every rank.
TEST_F(JoinTest, AJoinedRankChangesNoScaledMinMaxOrProduct) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  int last = -1;
  if (rank_ == 0) {
    last = join();
  } else {
    struct Case {
      ReduceOp op;
      DataType dtype;
      double prescale;
      double want;
    };
    const std::vector<Case> cases = {
        {ReduceOp::kMin, DataType::kFloat32, -1.0, -static_cast<double>(size_)},
        {ReduceOp::kMax, DataType::kFloat64, -2.0, -4.0},  // rank 1's 2, scaled
        {ReduceOp::kMin, DataType::kFloat16, 0.5, 1.0},
        {ReduceOp::kMax, DataType::kInt32, -1.0, -2.0},
        {ReduceOp::kMin, DataType::kFloat32, 0.0, 0.0},
    };
    for (const Case& c : cases) {
      HostTensor t(c.dtype, {3});
      for (int i = 0; i < 3; ++i) t.Set(i, rank_ + 1);
      AllreduceOptions options = Named("", c.op);
      options.prescale = c.prescale;
      ASSERT_TRUE(Succeeds(allreduce(t.view(), options)));
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(t.Get(i), c.want)
            << ReduceOpName(c.op) << " " << DataTypeName(c.dtype) << " prescale " << c.prescale;
      }
    }
    HostTensor t(DataType::kFloat32, {3});
    for (int i = 0; i < 3; ++i) t.Set(i, rank_ + 1);
    AllreduceOptions scaled = Named("join.scaled_product", ReduceOp::kProduct);
    scaled.prescale = 2.0;
    EXPECT_TRUE(FailsWith(allreduce(t.view(), scaled), StatusCode::kMismatch,
                          "with op product and prescale 2 cannot run while rank 0 has joined"));
    ASSERT_TRUE(Succeeds(allreduce(t.view(), Named("join.product", ReduceOp::kProduct))));
    double want = 1;
    for (int r = 1; r < size_; ++r) want *= r + 1;
    EXPECT_EQ(t.Get(0), want);
    last = join();
  }
  ExpectAgreedOnEveryRank(last);
}

// Unnamed operations are named from a count on each rank, which a joined rank does not advance
// while it serves the others' unnamed allreduces and barriers: after the join every rank names
// its next ones alike again.
TEST_F(JoinTest, UnnamedOperationsMatchAgainAfterAnUnevenJoin) {
  for (int step = 0; step < 1 + rank_; ++step) {
    ASSERT_TRUE(Succeeds(barrier("")));
    HostTensor t(DataType::kFloat32, {2});
    t.Set(0, 1);
    ASSERT_TRUE(Succeeds(allreduce(t.view(), Named("", ReduceOp::kSum))));
  }
  ExpectAgreedOnEveryRank(join());
  ASSERT_TRUE(Succeeds(barrier("")));
  HostTensor t(DataType::kFloat32, {2});
  t.Set(0, 1);
  ASSERT_TRUE(Succeeds(allreduce(t.view(), Named("", ReduceOp::kSum))));
  EXPECT_EQ(t.Get(0), size_);
}

// A process-set change that fails because a rank has joined counts on the ranks that called it
// only; after the join the next change is named alike on every rank again.
TEST_F(JoinTest, AProcessSetChangeRefusedWhileARankHasJoinedLeavesTheRanksInStep) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  int last = -1;
  if (rank_ == 0) {
    last = join();
  } else {
    EXPECT_THROW(add_process_set({0}), Error);
    last = join();
  }
  ExpectAgreedOnEveryRank(last);
  const ProcessSet first = add_process_set({0});
  EXPECT_EQ(first.size(), 1);
  remove_process_set(first);
}

TEST_F(JoinTest, EveryRankJoiningAtOnce) {
  const int last = join();
  EXPECT_GE(last, 0);
  EXPECT_LT(last, size_);
  ExpectAgreedOnEveryRank(last);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
