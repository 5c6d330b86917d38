// Reducescatter across ranks: every dtype and reduce op, row counts that do and do not divide by
// the number of ranks, fused tensors, scale factors, and validation errors on every rank.
#include <memory>

#include "ops/data_plane.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

constexpr int64_t kWidth = 3;  // elements per row

// Where an allocator puts the output: shared, because the allocator runs later, on the
// background thread, after the Scatter holding it may have moved.
using OutputSlot = std::shared_ptr<std::unique_ptr<HostTensor>>;

struct Scatter {
  std::unique_ptr<HostTensor> in;
  OutputSlot out = std::make_shared<std::unique_ptr<HostTensor>>();
  Handle handle;
  ReduceOp op = ReduceOp::kSum;
  DataType dtype = DataType::kFloat32;
  int64_t rows = 0;
};

Allocator Into(OutputSlot out) {
  return [out](const std::vector<int64_t>& shape, DataType dtype) {
    *out = std::make_unique<HostTensor>(dtype, shape);
    return (*out)->data();
  };
}

ReducescatterOptions Named(const std::string& name) {
  ReducescatterOptions options;
  options.name = name;
  return options;
}

class ReducescatterTest : public MultiRankTest {
 protected:
  Scatter Enqueue(DataType dtype, ReduceOp op, int64_t rows, const std::string& name,
                  double prescale = 1.0, double postscale = 1.0) {
    Scatter s;
    s.op = op;
    s.dtype = dtype;
    s.rows = rows;
    s.in = std::make_unique<HostTensor>(dtype, std::vector<int64_t>{rows, kWidth});
    for (int64_t i = 0; i < s.in->size(); ++i) s.in->Set(i, Value(op, rank_, i));
    ReducescatterOptions options;
    options.name = name;
    options.op = op;
    options.prescale = prescale;
    options.postscale = postscale;
    s.handle = reducescatter(s.in->view(), Into(s.out), options);
    return s;
  }

  // This rank's rows of the full reduction, element by element.
  void ExpectShare(const Scatter& s, double scale = 1.0) {
    ASSERT_TRUE(Succeeds(s.handle));
    const std::vector<int64_t> rows = EvenSplits(s.rows, size_);
    int64_t first_row = 0;
    for (int r = 0; r < rank_; ++r) first_row += rows[r];
    ASSERT_EQ(s.handle.output_shape(), (std::vector<int64_t>{rows[rank_], kWidth}));
    const HostTensor* out = s.out->get();
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(out->size(), rows[rank_] * kWidth);
    int mismatches = 0;
    for (int64_t i = 0; i < out->size() && mismatches < 3; ++i) {
      const double want = scale * Expected(s.op, s.dtype, size_, first_row * kWidth + i);
      if (std::abs(out->Get(i) - want) > Tolerance(s.dtype, want)) {
        ++mismatches;
        ADD_FAILURE() << DataTypeName(s.dtype) << " " << ReduceOpName(s.op) << " rows " << s.rows
                      << " element " << i << ": got " << out->Get(i) << ", want " << want;
      }
    }
  }
};

TEST_F(ReducescatterTest, EveryDtypeOpAndRowCount) {
  // 0 rows, fewer rows than ranks, an uneven split, and several megabytes.
  const std::vector<int64_t> row_counts = {0, 1, 10, (1 << 18) + 3};
  std::vector<Scatter> pending;
  int index = 0;
  for (DataType dtype : AllDataTypes()) {
    for (ReduceOp op : kAllReduceOps) {
      for (int64_t rows : row_counts) {
        pending.push_back(Enqueue(dtype, op, rows, "rs." + std::to_string(index++)));
      }
    }
  }
  for (const Scatter& s : pending) ExpectShare(s);
}

TEST_F(ReducescatterTest, ManySmallTensorsFuseOverSeveralSteps) {
  for (int step = 0; step < 3; ++step) {
    std::vector<Scatter> pending;
    for (int t = 0; t < 200; ++t) {
      pending.push_back(
          Enqueue(DataType::kFloat32, ReduceOp::kSum, 1 + t % 7, "rs.small." + std::to_string(t)));
    }
    for (const Scatter& s : pending) ExpectShare(s);
  }
}

TEST_F(ReducescatterTest, ScaleFactorsAndAverage) {
  ExpectShare(Enqueue(DataType::kFloat64, ReduceOp::kSum, 9, "rs.scaled", 2.0, 0.25), 0.5);
  ExpectShare(Enqueue(DataType::kFloat32, ReduceOp::kAverage, 9, "rs.average"));
}

TEST_F(ReducescatterTest, MismatchedShapeFailsOnEveryRankAndLaterOnesWork) {
  HostTensor in(DataType::kFloat32, {4 + (rank_ == size_ - 1 && size_ > 1 ? 1 : 0), 2});
  Handle h = reducescatter(in.view(), Into(std::make_shared<std::unique_ptr<HostTensor>>()),
                           Named("rs.mismatch"));
  if (size_ > 1) {
    EXPECT_TRUE(FailsWith(h, StatusCode::kMismatch, "shape"));
  } else {
    EXPECT_TRUE(Succeeds(h));
  }
  ExpectShare(Enqueue(DataType::kInt32, ReduceOp::kMax, 6, "rs.after"));
}

// An allocator that fails on one rank fails that tensor on that rank only. The rank still sends
// its input, so the other ranks' shares of that tensor are whole, and every tensor grouped (so
// fused) with it succeeds everywhere.
TEST_F(ReducescatterTest, FailedAllocatorFailsOnlyItsTensorOnItsRank) {
  const int failing_rank = size_ - 1;
  std::vector<Scatter> group(3);
  std::vector<TensorView> inputs;
  std::vector<Allocator> allocators;
  for (size_t t = 0; t < group.size(); ++t) {
    Scatter& s = group[t];
    s.rows = 5 + static_cast<int64_t>(t);
    s.in = std::make_unique<HostTensor>(s.dtype, std::vector<int64_t>{s.rows, kWidth});
    for (int64_t i = 0; i < s.in->size(); ++i) s.in->Set(i, Value(s.op, rank_, i));
    inputs.push_back(s.in->view());
    allocators.push_back(Into(s.out));
  }
  if (rank_ == failing_rank) {
    allocators[1] = [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; };
  }
  GroupedReducescatterOptions options;
  options.names = {"rs.alloc.before", "rs.alloc.failing", "rs.alloc.after"};
  const std::vector<Handle> handles = grouped_reducescatter(inputs, allocators, options);
  for (size_t t = 0; t < group.size(); ++t) group[t].handle = handles[t];
  ExpectShare(group[0]);
  ExpectShare(group[2]);
  if (rank_ == failing_rank) {
    EXPECT_TRUE(FailsWith(group[1].handle, StatusCode::kInvalidArgument,
                          "'rs.alloc.failing': the output allocator gave no memory"));
  } else {
    ExpectShare(group[1]);
  }
  ExpectShare(Enqueue(DataType::kInt32, ReduceOp::kSum, 6, "rs.alloc.next"));
}

TEST_F(ReducescatterTest, BadInputIsRefusedAtEnqueue) {
  HostTensor scalar(DataType::kFloat32, {});
  OutputSlot out = std::make_shared<std::unique_ptr<HostTensor>>();
  EXPECT_TRUE(ThrowsWith([&] { reducescatter(scalar.view(), Into(out), Named("rs.scalar")); },
                         StatusCode::kInvalidArgument, "scalar"));
  HostTensor in(DataType::kFloat32, {4});
  EXPECT_TRUE(ThrowsWith([&] { reducescatter(in.view(), nullptr, Named("rs.noalloc")); },
                         StatusCode::kInvalidArgument, "allocator"));
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
