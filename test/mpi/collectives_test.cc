// Every collective swept over dtypes, reduce ops, element counts (0, 1, odd, several MB) and
// ranks submitting in different orders, checked exactly on integer-valued data.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <thread>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

const std::vector<int64_t> kCounts = {0, 1, 17, (1 << 20) + 3};
struct Pending {
  std::unique_ptr<HostTensor> in, out;
  Handle handle;
  ReduceOp op;
  DataType dtype;
};

class CollectivesTest : public MultiRankTest {};

TEST_F(CollectivesTest, AllreduceEveryDtypeOpAndCount) {
  std::vector<Pending> pending;
  int index = 0;
  for (DataType dtype : AllDataTypes()) {
    for (ReduceOp op : kAllReduceOps) {
      for (int64_t count : kCounts) {
        for (bool in_place : {true, false}) {
          Pending p{std::make_unique<HostTensor>(dtype, std::vector<int64_t>{count}),
                    nullptr,
                    {},
                    op,
                    dtype};
          for (int64_t i = 0; i < count; ++i) p.in->Set(i, Value(op, rank_, i));
          AllreduceOptions options;
          options.op = op;
          options.name = "sweep." + std::to_string(index++);
          if (in_place) {
            p.handle = allreduce(p.in->view(), options);
          } else {
            p.out = std::make_unique<HostTensor>(dtype, std::vector<int64_t>{count});
            p.handle = allreduce(p.in->view(), p.out->view(), options);
          }
          pending.push_back(std::move(p));
        }
      }
    }
  }
  for (Pending& p : pending) {
    ASSERT_TRUE(Succeeds(p.handle));
    const HostTensor& result = p.out ? *p.out : *p.in;
    int mismatches = 0;
    for (int64_t i = 0; i < result.size() && mismatches < 3; ++i) {
      const double want = Expected(p.op, p.dtype, size_, i);
      if (std::abs(result.Get(i) - want) > Tolerance(p.dtype, want)) {
        ++mismatches;
        ADD_FAILURE() << DataTypeName(p.dtype) << " " << ReduceOpName(p.op) << " count "
                      << result.size() << " element " << i << ": got " << result.Get(i) << ", want "
                      << want;
      }
    }
  }
}

TEST_F(CollectivesTest, PrescaleAndPostscaleAreApplied) {
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                         DataType::kFloat64, DataType::kInt32}) {
    for (int64_t count : {int64_t{1}, int64_t{33}, int64_t{1} << 18}) {
      HostTensor t(dtype, {count});
      for (int64_t i = 0; i < count; ++i) t.Set(i, (i + rank_) % 5);
      AllreduceOptions options;
      options.prescale = 2.0;
      options.postscale = 0.25;
      ASSERT_TRUE(Succeeds(allreduce(t.view(), options)));
      for (int64_t i = 0; i < count; ++i) {
        double sum = 0;
        for (int r = 0; r < size_; ++r) sum += (i + r) % 5;
        const double want = IsFloatingPoint(dtype) ? sum * 0.5 : std::trunc(sum * 2 * 0.25);
        ASSERT_NEAR(t.Get(i), want, Tolerance(dtype, want)) << DataTypeName(dtype) << " " << i;
      }
    }
  }
}

TEST_F(CollectivesTest, RanksEnqueueingInDifferentOrdersGetCorrectSums) {
  constexpr int kTensors = 64;
  std::vector<std::unique_ptr<HostTensor>> tensors;
  for (int t = 0; t < kTensors; ++t) {
    tensors.push_back(std::make_unique<HostTensor>(DataType::kInt64, std::vector<int64_t>{t + 1}));
    for (int64_t i = 0; i <= t; ++i) tensors[t]->Set(i, t * 1000 + rank_);
  }
  std::vector<int> order(kTensors);
  for (int t = 0; t < kTensors; ++t) order[t] = t;
  std::shuffle(order.begin(), order.end(), std::mt19937(rank_ * 7919 + 1));
  std::vector<Handle> handles(kTensors);
  for (int t : order) {
    AllreduceOptions options;
    options.name = "ordered." + std::to_string(t);
    handles[t] = allreduce(tensors[t]->view(), options);
  }
  const double rank_sum = size_ * (size_ - 1) / 2.0;
  for (int t = 0; t < kTensors; ++t) {
    ASSERT_TRUE(Succeeds(handles[t]));
    for (int64_t i = 0; i <= t; ++i) ASSERT_EQ(tensors[t]->Get(i), t * 1000.0 * size_ + rank_sum);
  }
}

TEST_F(CollectivesTest, HundredsOfSmallTensorsFuseOverSeveralSteps) {
  constexpr int kTensors = 500, kSteps = 3;
  std::vector<HostTensor> tensors(kTensors, HostTensor(DataType::kFloat32, {16}));
  std::atomic<int> callbacks{0};
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Handle> handles;
    for (int t = kTensors - 1; t >= 0; --t) {
      for (int64_t i = 0; i < 16; ++i) tensors[t].Set(i, t + i + rank_ + step);
      AllreduceOptions options;
      options.name = "small." + std::to_string(t);
      options.on_complete = [&](const Status& s) {
        if (s.ok()) ++callbacks;
      };
      handles.push_back(allreduce(tensors[t].view(), options));
    }
    for (const Handle& h : handles) ASSERT_TRUE(Succeeds(h));
    const double rank_sum = size_ * (size_ - 1) / 2.0;
    for (int t = 0; t < kTensors; ++t) {
      for (int64_t i = 0; i < 16; ++i) {
        ASSERT_EQ(tensors[t].Get(i), (t + i + step) * size_ + rank_sum) << t << " " << i;
      }
    }
  }
  EXPECT_EQ(callbacks.load(), kTensors * kSteps);
}

// Fused buckets back to back, each larger than the last, all in flight at once: on one node the
// shared-memory path grows its segment mid-run and alternates its two regions between consecutive
// buckets, and every sum must still be exact.
TEST_F(CollectivesTest, BackToBackFusedBucketsOfGrowingSize) {
  constexpr int kSteps = 24;
  std::vector<std::vector<HostTensor>> tensors;
  std::vector<std::vector<Handle>> handles;
  for (int s = 0; s < kSteps; ++s) {
    const int count = 2 + s;
    const int64_t elements = int64_t{64} << (s / 4);
    tensors.emplace_back(count, HostTensor(DataType::kFloat32, {elements}));
    std::vector<TensorView> views;
    for (int t = 0; t < count; ++t) {
      for (int64_t i = 0; i < elements; ++i) tensors[s][t].Set(i, rank_ + s + t + i % 7);
      views.push_back(tensors[s][t].view());
    }
    handles.push_back(grouped_allreduce(views, GroupedAllreduceOptions()));
  }
  const double rank_sum = size_ * (size_ - 1) / 2.0;
  for (int s = 0; s < kSteps; ++s) {
    for (const Handle& h : handles[s]) ASSERT_TRUE(Succeeds(h)) << "step " << s;
    for (size_t t = 0; t < tensors[s].size(); ++t) {
      for (int64_t i = 0; i < tensors[s][t].size(); ++i) {
        ASSERT_EQ(tensors[s][t].Get(i), (s + t + i % 7) * size_ + rank_sum)
            << "step " << s << " tensor " << t << " element " << i;
      }
    }
  }
}

TEST_F(CollectivesTest, AllgatherWithDifferentFirstDimensions) {
  for (DataType dtype : AllDataTypes()) {
    // Rank r contributes r % 3 rows (rank 0 none), each row 3 elements tagged with its rank.
    const int64_t rows = rank_ % 3;
    HostTensor in(dtype, {rows, 3});
    for (int64_t i = 0; i < rows * 3; ++i) in.Set(i, rank_ + 1);
    std::unique_ptr<HostTensor> out;
    Handle h = allgather(in.view(), [&](const std::vector<int64_t>& shape, DataType t) {
      out = std::make_unique<HostTensor>(t, shape);
      return out->data();
    });
    ASSERT_TRUE(Succeeds(h));
    int64_t total_rows = 0;
    for (int r = 0; r < size_; ++r) total_rows += r % 3;
    ASSERT_EQ(h.output_shape(), (std::vector<int64_t>{total_rows, 3}));
    int64_t at = 0;
    for (int r = 0; r < size_; ++r) {
      for (int64_t i = 0; i < (r % 3) * 3; ++i) ASSERT_EQ(out->Get(at++), r + 1);
    }
  }
}

TEST_F(CollectivesTest, AllgatherOfSeveralMegabytes) {
  const int64_t rows = (1 << 18) + rank_;
  HostTensor in(DataType::kFloat32, {rows, 4});
  for (int64_t i = 0; i < in.size(); ++i) in.Set(i, (i % 1000) + rank_);
  std::vector<float> out;
  Handle h = allgather(in.view(), [&](const std::vector<int64_t>& shape, DataType) {
    out.resize(shape[0] * shape[1]);
    return out.data();
  });
  ASSERT_TRUE(Succeeds(h));
  int64_t at = 0;
  for (int r = 0; r < size_; ++r) {
    for (int64_t i = 0; i < ((1 << 18) + r) * 4; ++i) ASSERT_EQ(out[at++], (i % 1000) + r);
  }
}

TEST_F(CollectivesTest, BroadcastFromEveryRoot) {
  for (DataType dtype : AllDataTypes()) {
    for (int64_t count : kCounts) {
      for (int root = 0; root < size_; ++root) {
        HostTensor t(dtype, {count});
        for (int64_t i = 0; i < count; ++i) t.Set(i, rank_ == root ? (i % 100) : 0);
        ASSERT_TRUE(Succeeds(broadcast(t.view(), root)));
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(t.Get(i), i % 100);
      }
    }
  }
}

TEST_F(CollectivesTest, BarrierCompletes) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Succeeds(barrier()));
  ASSERT_TRUE(Succeeds(barrier("named.barrier")));
}

TEST_F(CollectivesTest, EnqueueFromSeveralThreads) {
  constexpr int kThreads = 4, kPerThread = 50;
  std::vector<HostTensor> tensors(kThreads * kPerThread, HostTensor(DataType::kInt32, {8}));
  std::vector<Handle> handles(tensors.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        const int id = t * kPerThread + k;
        for (int64_t i = 0; i < 8; ++i) tensors[id].Set(i, id);
        AllreduceOptions options;
        options.name = "threaded." + std::to_string(id);
        handles[id] = allreduce(tensors[id].view(), options);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t id = 0; id < tensors.size(); ++id) {
    ASSERT_TRUE(Succeeds(handles[id]));
    ASSERT_EQ(tensors[id].Get(7), static_cast<double>(id) * size_);
  }
}

TEST_F(CollectivesTest, TopologyIsConsistent) {
  EXPECT_EQ(rank(), rank_);
  EXPECT_EQ(size(), size_);
  EXPECT_EQ(local_size() * cross_size(), size_);  // one node here, or equal-sized nodes
  EXPECT_GE(local_rank(), 0);
  EXPECT_LT(local_rank(), local_size());
  EXPECT_TRUE(is_initialized());
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
