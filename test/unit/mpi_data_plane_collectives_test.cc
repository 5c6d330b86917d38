// MpiDataPlane's allgather, broadcast, reducescatter and alltoall on a one-rank communicator: what
// they allocate and copy, and the entries they refuse.
#include "ops/mpi/mpi_data_plane.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "test/unit/mpi_data_plane_fixture.h"

namespace gradsync {
namespace mpi_plane_test {
namespace {

struct Allocation {
  std::vector<int64_t> shape;
  DataType dtype = DataType::kUInt8;
  std::vector<uint8_t> memory;
};

OutputAllocator AllocateInto(Allocation* a) {
  return [a](const std::vector<int64_t>& shape, DataType dtype) -> void* {
    a->shape = shape;
    a->dtype = dtype;
    a->memory.resize(static_cast<size_t>(TensorView(nullptr, dtype, shape).num_bytes()) + 1);
    return a->memory.data();
  };
}

TEST_F(MpiDataPlaneTest, AllgatherAllocatesAndCopies) {
  HostTensor in(DataType::kInt32, {2, 3});
  in.Fill(0);
  auto entry = MakeEntry("emb", &in, &in);
  Allocation alloc;
  entry->allocator = AllocateInto(&alloc);
  const Status s = plane_->Allgather(entry.get(), {2});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(alloc.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(alloc.dtype, DataType::kInt32);
  EXPECT_EQ(entry->output.data, alloc.memory.data());
  EXPECT_EQ(entry->output.shape, alloc.shape);
  EXPECT_EQ(entry->state->output_shape, alloc.shape);
  EXPECT_EQ(std::memcmp(alloc.memory.data(), in.View().data, 24), 0);
}

TEST_F(MpiDataPlaneTest, AllgatherScalarGathersAsVector) {
  HostTensor in(DataType::kFloat64, {});
  in.Set(0, 7);
  auto entry = MakeEntry("loss", &in, &in);
  Allocation alloc;
  entry->allocator = AllocateInto(&alloc);
  ASSERT_TRUE(plane_->Allgather(entry.get(), {1}).ok());
  EXPECT_EQ(alloc.shape, std::vector<int64_t>{1});
  double v = 0;
  std::memcpy(&v, alloc.memory.data(), sizeof(v));
  EXPECT_EQ(v, 7);
}

TEST_F(MpiDataPlaneTest, AllgatherAllocatorFailureNamesTensor) {
  HostTensor in(DataType::kFloat32, {4});
  auto entry = MakeEntry("activations", &in, &in);
  entry->output = TensorView();
  entry->allocator = [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; };
  const Status s = plane_->Allgather(entry.get(), {4});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("activations"), std::string::npos) << s.message();
  EXPECT_EQ(entry->output.data, nullptr);
}

TEST_F(MpiDataPlaneTest, AllgatherEmptyOutputMayBeNull) {
  TensorEntry entry;
  entry.name = "none";
  entry.input = TensorView(nullptr, DataType::kFloat32, {0, 5});
  entry.state = std::make_shared<OpState>();
  entry.allocator = [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; };
  ASSERT_TRUE(plane_->Allgather(&entry, {0}).ok());
  EXPECT_EQ(entry.state->output_shape, (std::vector<int64_t>{0, 5}));
}

TEST_F(MpiDataPlaneTest, AllgatherRejectsInconsistentFirstDims) {
  HostTensor in(DataType::kFloat32, {4});
  auto entry = MakeEntry("x", &in, &in);
  Allocation alloc;
  entry->allocator = AllocateInto(&alloc);
  EXPECT_EQ(plane_->Allgather(entry.get(), {3}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plane_->Allgather(entry.get(), {4, 4}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(alloc.shape.empty()) << "allocated for a plan that was refused";
}

TEST_F(MpiDataPlaneTest, BroadcastFromRootZero) {
  HostTensor in(DataType::kBFloat16, {3, 5}), orig = in;
  in.Fill(2);
  orig.Fill(2);
  auto entry = MakeEntry("params", &in, &in);
  const Status s = plane_->Broadcast(entry.get(), 0);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectScaled(in, orig, 1.0);
}

TEST_F(MpiDataPlaneTest, BroadcastRejectsRootOutsideCommunicator) {
  HostTensor in(DataType::kFloat32, {1});
  auto entry = MakeEntry("params", &in, &in);
  const Status s = plane_->Broadcast(entry.get(), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("params"), std::string::npos) << s.message();
}

TEST(EvenSplits, LowerPartsTakeTheRemainder) {
  EXPECT_EQ(EvenSplits(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(EvenSplits(0, 3), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(EvenSplits(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(EvenSplits(7, 1), (std::vector<int64_t>{7}));
}

// An entry whose output the data plane allocates; the input keeps its original for comparison.
struct AllocatedEntry {
  AllocatedEntry(const std::string& name, DataType dtype, std::vector<int64_t> shape, double base)
      : input(dtype, shape), original(dtype, shape), entry(std::make_unique<TensorEntry>()) {
    input.Fill(base);
    original.Fill(base);
    entry->name = name;
    entry->input = input.View();
    entry->state = std::make_shared<OpState>();
    entry->allocator = AllocateInto(&alloc);
  }
  // The allocated output as a HostTensor, to read it element by element.
  HostTensor Output() const {
    HostTensor out(alloc.dtype, alloc.shape);
    std::memcpy(out.View().data, alloc.memory.data(), alloc.memory.size() - 1);
    return out;
  }

  HostTensor input, original;
  Allocation alloc;
  std::unique_ptr<TensorEntry> entry;
};

// One rank: every rank's share is the whole reduction of the one input, scaled.
void ExpectReduced(const AllocatedEntry& e, DataType dtype, double prescale, double postscale) {
  SCOPED_TRACE(e.entry->name);
  ASSERT_EQ(e.alloc.shape, e.entry->input.shape);
  EXPECT_EQ(e.alloc.dtype, dtype);
  EXPECT_EQ(e.entry->output.shape, e.alloc.shape);
  EXPECT_EQ(e.entry->state->output_shape, e.alloc.shape);
  const HostTensor out = e.Output();
  for (int64_t k = 0; k < e.original.size(); ++k) {
    const double pre = e.original.Get(k) * prescale;  // exact in every dtype for these values
    const double expected =
        IsFloatingPoint(dtype) ? pre * postscale : std::trunc(std::trunc(pre) * postscale);
    ASSERT_EQ(out.Get(k), expected) << "element " << k;
  }
  ExpectScaled(e.input, e.original, 1.0);
}

TEST_F(MpiDataPlaneTest, ReducescatterSingleEntryEveryDtypeAndOp) {
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      // A prescale of 1 reduces straight from the input; any other goes through the buffer.
      for (double prescale : {1.0, 3.0}) {
        SCOPED_TRACE(DataTypeName(dtype) + " " + ReduceOpName(op) + " x" +
                     std::to_string(prescale));
        AllocatedEntry e("shard", dtype, {5, 3}, 1);
        const Status s = Reducescatter({e.entry.get()}, Spec(dtype, op, prescale, 0.5));
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(e.entry->output.data, e.alloc.memory.data());
        ExpectReduced(e, dtype, prescale, 0.5);
      }
    }
  }
}

TEST_F(MpiDataPlaneTest, ReducescatterFusedEntries) {
  const std::vector<std::vector<int64_t>> shapes = {{0, 3}, {1}, {5, 2}, {17}, {4, 0}, {3, 2, 2}};
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                         DataType::kInt32, DataType::kInt64, DataType::kUInt8}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      SCOPED_TRACE(DataTypeName(dtype) + " " + ReduceOpName(op));
      std::vector<std::unique_ptr<AllocatedEntry>> owned;
      std::vector<TensorEntry*> entries;
      for (size_t i = 0; i < shapes.size(); ++i) {
        owned.push_back(std::make_unique<AllocatedEntry>("t" + std::to_string(i), dtype, shapes[i],
                                                         static_cast<double>(i)));
        entries.push_back(owned.back()->entry.get());
      }
      const Status s = Reducescatter(entries, Spec(dtype, op, 3, 0.5));
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (const auto& e : owned) ASSERT_NO_FATAL_FAILURE(ExpectReduced(*e, dtype, 3, 0.5));
    }
  }
}

TEST_F(MpiDataPlaneTest, ReducescatterZeroRowsMayAllocateNull) {
  TensorEntry entry;
  entry.name = "none";
  entry.input = TensorView(nullptr, DataType::kFloat32, {0, 4});
  entry.state = std::make_shared<OpState>();
  entry.allocator = [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; };
  for (double prescale : {1.0, 2.0}) {
    const Status s = Reducescatter({&entry}, Spec(DataType::kFloat32, ReduceOp::kSum, prescale));
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(entry.state->output_shape, (std::vector<int64_t>{0, 4}));
    EXPECT_EQ(entry.output.shape, (std::vector<int64_t>{0, 4}));
    EXPECT_EQ(entry.output.data, nullptr);
  }
}

// A failed allocation fails that entry alone, with a message naming it and its shape; the entries
// fused with it are reduced as usual.
TEST_F(MpiDataPlaneTest, ReducescatterAllocatorFailureFailsThatEntryAlone) {
  const OutputAllocator failures[] = {
      [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; },
      [](const std::vector<int64_t>&, DataType) -> void* { throw std::bad_alloc(); }, nullptr};
  for (const OutputAllocator& failure : failures) {
    for (bool fused : {false, true}) {
      SCOPED_TRACE(fused ? "fused" : "single");
      AllocatedEntry before("before", DataType::kFloat32, {4}, 1);
      AllocatedEntry bad("layer3.out", DataType::kFloat32, {3, 2}, 2);
      AllocatedEntry after("after", DataType::kFloat32, {2, 5}, 3);
      bad.entry->allocator = failure;
      std::vector<TensorEntry*> entries = {bad.entry.get()};
      if (fused) entries = {before.entry.get(), bad.entry.get(), after.entry.get()};
      const double prescale = fused ? 1 : 2;
      const Status s = Reducescatter(entries, Spec(DataType::kFloat32, ReduceOp::kSum, prescale));
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(failures_.size(), 1u);
      EXPECT_EQ(failures_[0].entry, bad.entry.get());
      const Status& why = failures_[0].status;
      EXPECT_EQ(why.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(why.message().find("'layer3.out'"), std::string::npos) << why.message();
      EXPECT_NE(why.message().find("[3x2]"), std::string::npos) << why.message();
      EXPECT_EQ(bad.entry->output.data, nullptr);
      EXPECT_TRUE(bad.entry->state->output_shape.empty());
      if (fused) {
        ExpectReduced(before, DataType::kFloat32, prescale, 1.0);
        ExpectReduced(after, DataType::kFloat32, prescale, 1.0);
      }
    }
  }
}

TEST_F(MpiDataPlaneTest, ReducescatterRefusesBadEntriesBeforeAllocating) {
  AllocatedEntry scalar("loss", DataType::kFloat32, {}, 0);
  Status s = Reducescatter({scalar.entry.get()}, Spec(DataType::kFloat32, ReduceOp::kSum));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'loss'"), std::string::npos) << s.message();

  AllocatedEntry ints("layer1.bias", DataType::kInt32, {3}, 0);
  s = Reducescatter({ints.entry.get()}, Spec(DataType::kFloat32, ReduceOp::kSum));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'layer1.bias'"), std::string::npos) << s.message();

  AllocatedEntry on_gpu("on_gpu", DataType::kFloat32, {3}, 0);
  on_gpu.entry->input.device = Device::Cuda(0);
  s = Reducescatter({on_gpu.entry.get()}, Spec(DataType::kFloat32, ReduceOp::kSum));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'on_gpu'"), std::string::npos) << s.message();

  AllocatedEntry odd_op("odd_op", DataType::kFloat32, {3}, 0);
  s = Reducescatter({odd_op.entry.get()}, Spec(DataType::kFloat32, static_cast<ReduceOp>(99)));
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'odd_op'"), std::string::npos) << s.message();

  for (const AllocatedEntry* e : {&scalar, &ints, &on_gpu, &odd_op}) {
    EXPECT_TRUE(e->alloc.shape.empty()) << "allocated for refused tensor " << e->entry->name;
  }
}

TEST_F(MpiDataPlaneTest, ReducescatterBeyondIntCountsIsUnsupported) {
  char untouched = 0;  // the size check refuses the tensor before any data is read
  TensorEntry entry;
  entry.name = "huge";
  entry.input = TensorView(&untouched, DataType::kUInt8, {int64_t{INT_MAX} + 1});
  bool allocated = false;
  entry.allocator = [&](const std::vector<int64_t>&, DataType) -> void* {
    allocated = true;
    return nullptr;
  };
  const Status s = Reducescatter({&entry}, Spec(DataType::kUInt8, ReduceOp::kSum));
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'huge'"), std::string::npos) << s.message();
  EXPECT_FALSE(allocated);
}

TEST_F(MpiDataPlaneTest, AlltoallExplicitAndEvenSplits) {
  for (bool even : {false, true}) {
    SCOPED_TRACE(even ? "even splits" : "explicit splits");
    AllocatedEntry e("tokens", DataType::kInt32, {4, 3}, 0);
    if (!even) e.entry->splits = {4};
    const Status s = plane_->Alltoall(e.entry.get());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(e.alloc.shape, (std::vector<int64_t>{4, 3}));
    EXPECT_EQ(e.alloc.dtype, DataType::kInt32);
    EXPECT_EQ(e.entry->output.data, e.alloc.memory.data());
    EXPECT_EQ(e.entry->output.shape, e.alloc.shape);
    EXPECT_EQ(e.entry->state->output_shape, e.alloc.shape);
    EXPECT_EQ(e.entry->state->received_splits, std::vector<int64_t>{4});
    ExpectScaled(e.Output(), e.original, 1.0);
  }
}

TEST_F(MpiDataPlaneTest, AlltoallZeroRowsMayAllocateNull) {
  TensorEntry entry;
  entry.name = "none";
  entry.input = TensorView(nullptr, DataType::kFloat64, {0, 5});
  entry.state = std::make_shared<OpState>();
  entry.allocator = [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; };
  const Status s = plane_->Alltoall(&entry);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(entry.state->output_shape, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(entry.state->received_splits, std::vector<int64_t>{0});
  EXPECT_EQ(entry.output.data, nullptr);
}

TEST_F(MpiDataPlaneTest, AlltoallRejectsBadSplits) {
  const std::vector<int64_t> bad_splits[] = {{2, 2}, {-1}, {3}, {5}};
  for (const std::vector<int64_t>& splits : bad_splits) {
    SCOPED_TRACE(ShapeString(splits));
    AllocatedEntry e("routing", DataType::kFloat32, {4}, 0);
    e.entry->splits = splits;
    const Status s = plane_->Alltoall(e.entry.get());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("'routing'"), std::string::npos) << s.message();
    EXPECT_TRUE(e.alloc.shape.empty()) << "allocated for refused splits";
    EXPECT_TRUE(e.entry->state->received_splits.empty());
  }
}

TEST_F(MpiDataPlaneTest, AlltoallRefusesScalarsAndOversizedParts) {
  AllocatedEntry scalar("loss", DataType::kFloat32, {}, 0);
  Status s = plane_->Alltoall(scalar.entry.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'loss'"), std::string::npos) << s.message();

  char untouched = 0;  // the size check refuses the tensor before any data is read
  TensorEntry huge;
  huge.name = "huge";
  huge.input = TensorView(&untouched, DataType::kUInt8, {int64_t{INT_MAX} + 1});
  s = plane_->Alltoall(&huge);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'huge'"), std::string::npos) << s.message();
}

TEST_F(MpiDataPlaneTest, AlltoallAllocatorFailureNamesTensorAndShape) {
  AllocatedEntry e("experts.in", DataType::kBFloat16, {6, 2}, 0);
  e.entry->allocator = [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; };
  const Status s = plane_->Alltoall(e.entry.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'experts.in'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[6x2]"), std::string::npos) << s.message();
  EXPECT_EQ(e.entry->output.data, nullptr);
}

}  // namespace
}  // namespace mpi_plane_test
}  // namespace gradsync
