// AllreduceBatch: how it cuts buckets, results of batched and lone tensors of several dtypes over
// many steps and start orders, members some rank did not start, the last bucket reduced by the
// caller from the second step on, and its refusals.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

class AllreduceBatchTest : public MultiRankTest {};

constexpr size_t kBelow = AllreduceBatch::kBatchedBelowBytes;

TensorView Spec(DataType dtype, int64_t elements) { return TensorView(nullptr, dtype, {elements}); }

// Buckets depend only on the list: no runtime is needed to make them.
TEST(AllreduceBatchLayout, BucketsFollowTheListByDtypeAndSize) {
  const int64_t small = 16;
  const auto floats = [](size_t bytes) { return static_cast<int64_t>(bytes / 4); };
  // Small float32 tensors around a large one share a bucket; float64 ones have their own.
  EXPECT_EQ(AllreduceBatch({Spec(DataType::kFloat32, small), Spec(DataType::kFloat64, small),
                            Spec(DataType::kFloat32, floats(kBelow)),
                            Spec(DataType::kFloat32, small), Spec(DataType::kFloat64, small)})
                .bucket_count(),
            2u);
  // A bucket holds at most kBucketBytes.
  std::vector<TensorView> many(AllreduceBatch::kBucketBytes / (kBelow / 2) + 1,
                               Spec(DataType::kFloat32, floats(kBelow / 2)));
  EXPECT_EQ(AllreduceBatch(many).bucket_count(), 2u);
  // And spans at most kBucketSpanBytes of the list: a large tensor between two small ones that
  // spans more closes the first bucket.
  EXPECT_EQ(AllreduceBatch({Spec(DataType::kFloat32, small),
                            Spec(DataType::kFloat32, floats(AllreduceBatch::kBucketSpanBytes)),
                            Spec(DataType::kFloat32, small)})
                .bucket_count(),
            2u);
  // Device tensors and tensors from kBatchedBelowBytes up are reduced alone.
  EXPECT_EQ(AllreduceBatch({TensorView(nullptr, DataType::kFloat32, {small}, Device::Cuda(0)),
                            Spec(DataType::kFloat32, floats(kBelow))})
                .bucket_count(),
            0u);
  EXPECT_EQ(AllreduceBatch({}).bucket_count(), 0u);
}

TEST(AllreduceBatchLayout, RefusesBadLists) {
  AllreduceBatchOptions named;
  named.names = {"a", "a"};
  EXPECT_TRUE(ThrowsWith(
      [&] {
        AllreduceBatch({Spec(DataType::kInt8, 1), Spec(DataType::kInt8, 1)}, named);
      },
      StatusCode::kInvalidArgument, "listed twice"));
  named.names = {"a"};
  EXPECT_TRUE(ThrowsWith(
      [&] {
        AllreduceBatch({Spec(DataType::kInt8, 1), Spec(DataType::kInt8, 1)}, named);
      },
      StatusCode::kInvalidArgument, "2 tensors but 1 names"));
  EXPECT_TRUE(ThrowsWith([] { AllreduceBatch({Spec(DataType::kInt8, -1)}); },
                         StatusCode::kInvalidArgument, "invalid shape"));
}

// A model's worth of tensors: small ones of two dtypes (batched), large ones (alone), empty ones.
struct Model {
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<TensorView> specs;

  Model() {
    const int64_t large = static_cast<int64_t>(kBelow / 4) + 3;
    for (int t = 0; t < 60; ++t) {
      const DataType dtype = t % 5 == 1 ? DataType::kFloat64 : DataType::kFloat32;
      const int64_t elements = t % 17 == 3 ? large : t % 13 == 7 ? 0 : 1 + (t * 37) % 900;
      tensors.push_back(std::make_unique<HostTensor>(dtype, std::vector<int64_t>{elements}));
      specs.push_back(Spec(dtype, elements));
    }
  }
  void Fill(ReduceOp op, int rank, int step) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (int64_t i = 0; i < tensors[t]->size(); ++i) {
        tensors[t]->Set(i, Value(op, rank, i + static_cast<int64_t>(t) + step));
      }
    }
  }
};

TEST_F(AllreduceBatchTest, SumsAndAveragesOverManyStepsInAnyStartOrder) {
  Model model;
  AllreduceBatchOptions options;
  for (size_t t = 0; t < model.specs.size(); ++t) options.names.push_back("m." + std::to_string(t));
  AllreduceBatch batch(model.specs, options);
  ASSERT_GE(batch.bucket_count(), 2u);
  options.op = ReduceOp::kAverage;
  options.prescale = 2.0;
  options.postscale = 0.5;
  for (std::string& name : options.names) name += ".avg";
  AllreduceBatch averaging(model.specs, options);
  std::mt19937 shuffle(static_cast<unsigned>(rank_) * 7919u + 1u);  // each rank its own order
  std::vector<size_t> order(model.specs.size());
  std::iota(order.begin(), order.end(), 0);
  for (int step = 0; step < 6; ++step) {  // the first step negotiates in full, the others cached
    const bool average = step % 2 == 1;
    const ReduceOp op = average ? ReduceOp::kAverage : ReduceOp::kSum;
    AllreduceBatch& used = average ? averaging : batch;
    model.Fill(op, rank_, step);
    std::shuffle(order.begin(), order.end(), shuffle);
    for (size_t t : order) used.start(t, model.tensors[t]->view().data);
    EXPECT_EQ(used.in_flight(), order.size());
    used.wait();
    EXPECT_EQ(used.in_flight(), 0u);
    for (size_t t = 0; t < model.tensors.size(); ++t) {
      HostTensor& tensor = *model.tensors[t];
      for (int64_t i = 0; i < tensor.size(); ++i) {
        const double expected =
            Expected(op, tensor.view().dtype, size_, i + static_cast<int64_t>(t) + step);
        ASSERT_NEAR(tensor.Get(i), expected, 1e-5 * std::max(1.0, std::abs(expected)))
            << "step " << step << " tensor " << t << " element " << i;
      }
    }
  }
}

// Rank 0 leaves one batched and one lone tensor out: the batched one is reduced as zeros from
// rank 0 (its memory there untouched), and the lone one on rank 0 goes its own way under the same
// name, as a framework's fallback path would.
TEST_F(AllreduceBatchTest, MembersNotStartedCountAsZeros) {
  const int64_t large = static_cast<int64_t>(kBelow / 4);
  std::vector<std::unique_ptr<HostTensor>> tensors;
  AllreduceBatchOptions options;
  std::vector<TensorView> specs;
  for (int64_t elements : {int64_t{10}, int64_t{20}, large, int64_t{30}}) {
    tensors.push_back(
        std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{elements}));
    specs.push_back(Spec(DataType::kFloat32, elements));
    options.names.push_back("unused." + std::to_string(specs.size()));
  }
  AllreduceBatch batch(specs, options);
  ASSERT_EQ(batch.bucket_count(), 1u);
  for (int step = 0; step < 3; ++step) {
    for (auto& tensor : tensors) {
      for (int64_t i = 0; i < tensor->size(); ++i) tensor->Set(i, 1.0);
    }
    Handle lone;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (rank_ == 0 && t == 1) continue;
      if (rank_ == 0 && t == 2) {
        AllreduceOptions own;
        own.name = options.names[t];
        lone = allreduce(tensors[t]->view(), own);
        continue;
      }
      batch.start(t, tensors[t]->view().data);
    }
    batch.wait();
    if (lone.valid()) {
      ASSERT_TRUE(Succeeds(lone));
    }
    for (size_t t = 0; t < tensors.size(); ++t) {
      const double expected = t == 1 ? (rank_ == 0 ? 1.0 : size_ - 1.0) : size_;
      ASSERT_EQ(tensors[t]->Get(0), expected) << "step " << step << " tensor " << t;
    }
  }
}

// The first step negotiates the last bucket and grants its lane; from the second the caller
// reduces it, with every dtype and op a lane takes, members left out, and a scale.
TEST_F(AllreduceBatchTest, CallerReducesTheLastBucketFromTheSecondStep) {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                         DataType::kInt32, DataType::kFloat64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::vector<std::unique_ptr<HostTensor>> tensors;
      std::vector<TensorView> specs;
      AllreduceBatchOptions options;
      options.op = op;
      options.postscale = 2.0;
      for (int64_t elements : {int64_t{3}, int64_t{0}, int64_t{17}, int64_t{1}}) {
        tensors.push_back(std::make_unique<HostTensor>(dtype, std::vector<int64_t>{elements}));
        specs.push_back(Spec(dtype, elements));
        options.names.push_back("lane." + DataTypeName(dtype) + "." + ReduceOpName(op) + "." +
                                std::to_string(specs.size()));
      }
      AllreduceBatch batch(specs, options);
      ASSERT_EQ(batch.bucket_count(), 1u);
      for (int step = 0; step < 4; ++step) {
        const bool left_out = step == 2 && rank_ == 0;  // rank 0 does not start tensor 2
        for (size_t t = 0; t < tensors.size(); ++t) {
          for (int64_t i = 0; i < tensors[t]->size(); ++i) tensors[t]->Set(i, rank_ + 1 + step);
          if (!(left_out && t == 2)) batch.start(t, tensors[t]->view().data);
        }
        batch.wait();
        EXPECT_EQ(batch.caller_reductions(),
                  CallerReduces(size_) ? static_cast<uint64_t>(step) : 0u)
            << DataTypeName(dtype) << " step " << step;
        for (size_t t = 0; t < tensors.size(); ++t) {
          if (left_out && t == 2) continue;
          double sum = 0;
          for (int r = 0; r < size_; ++r) {
            if (!(step == 2 && r == 0 && t == 2)) sum += r + 1 + step;
          }
          double want = 2.0 * (op == ReduceOp::kAverage ? sum / size_ : sum);
          if (dtype == DataType::kInt32) want = static_cast<double>(static_cast<int64_t>(want));
          for (int64_t i = 0; i < tensors[t]->size(); ++i) {
            ASSERT_NEAR(tensors[t]->Get(i), want, 0.02 * want)
                << DataTypeName(dtype) << " " << ReduceOpName(op) << " step " << step << " tensor "
                << t;
          }
        }
      }
    }
  }
}

// A 1-byte dtype has no lane: the flag that hands a lane's bucket back at a join is a sum in the
// bucket's dtype, which would read as no join at 256 joined ranks.
TEST_F(AllreduceBatchTest, OneByteDtypesStayNegotiated) {
  for (DataType dtype : {DataType::kUInt8, DataType::kInt8}) {
    HostTensor a(dtype, {5});
    AllreduceBatchOptions options;
    options.names = {"one.byte." + DataTypeName(dtype)};
    AllreduceBatch batch({a.view()}, options);
    for (int step = 0; step < 3; ++step) {
      for (int64_t i = 0; i < 5; ++i) a.Set(i, 1);
      batch.start(0, a.view().data);
      batch.wait();
      EXPECT_EQ(a.Get(4), size_);
    }
    EXPECT_EQ(batch.caller_reductions(), 0u) << DataTypeName(dtype);
  }
}

// A product has no lane: every step is negotiated.
TEST_F(AllreduceBatchTest, OpsOtherThanSumAndAverageStayNegotiated) {
  HostTensor a(DataType::kFloat32, {4});
  AllreduceBatchOptions options;
  options.names = {"product.a"};
  options.op = ReduceOp::kProduct;
  AllreduceBatch batch({a.view()}, options);
  for (int step = 0; step < 3; ++step) {
    for (int64_t i = 0; i < 4; ++i) a.Set(i, 2.0);
    batch.start(0, a.view().data);
    batch.wait();
    EXPECT_EQ(a.Get(3), std::pow(2.0, size_));
  }
  EXPECT_EQ(batch.caller_reductions(), 0u);
}

// Two batches with the same names, the first still alive: the newer one takes the lane.
TEST_F(AllreduceBatchTest, ANewerBatchOfTheSameNamesTakesTheLane) {
  HostTensor a(DataType::kFloat32, {8});
  AllreduceBatchOptions options;
  options.names = {"renewed.a"};
  auto older = std::make_unique<AllreduceBatch>(std::vector<TensorView>{a.view()}, options);
  for (int step = 0; step < 2; ++step) {
    a.Set(0, 1.0);
    older->start(0, a.view().data);
    older->wait();
    EXPECT_EQ(a.Get(0), size_);
  }
  AllreduceBatch newer({a.view()}, options);
  for (int step = 0; step < 3; ++step) {
    a.Set(0, 1.0);
    newer.start(0, a.view().data);
    newer.wait();
    EXPECT_EQ(a.Get(0), size_);
  }
  older.reset();
  a.Set(0, 1.0);
  newer.start(0, a.view().data);
  newer.wait();
  EXPECT_EQ(a.Get(0), size_);
  EXPECT_EQ(newer.caller_reductions(), CallerReduces(size_) ? 3u : 0u);
}

TEST_F(AllreduceBatchTest, RefusesRepeatedAndUnknownStarts) {
  HostTensor a(DataType::kFloat32, {4}), b(DataType::kFloat32, {4});
  AllreduceBatchOptions options;
  options.names = {"refuse.a", "refuse.b"};
  AllreduceBatch batch({a.view(), b.view()}, options);
  batch.wait();  // nothing started: nothing to do
  EXPECT_TRUE(ThrowsWith([&] { batch.start(2, a.view().data); }, StatusCode::kInvalidArgument,
                         "no tensor 2"));
  batch.start(0, a.view().data);
  EXPECT_TRUE(ThrowsWith([&] { batch.start(0, a.view().data); }, StatusCode::kInvalidArgument,
                         "started twice"));
  batch.start(1, b.view().data);
  batch.wait();
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(a.Get(i), 0.0);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
