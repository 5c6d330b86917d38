// MpiDataPlane on a one-rank communicator: exercises the packing, scaling, type and op mapping and
// error paths of allreduce without a launcher (Open MPI initializes a singleton); the other
// collectives: mpi_data_plane_collectives_test.cc.
#include "ops/mpi/mpi_data_plane.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/mpi/mpi_types.h"
#include "runtime/half.h"
#include "test/unit/mpi_data_plane_fixture.h"

namespace gradsync {
namespace mpi_plane_test {
namespace {

::testing::Environment* const kMpiEnvironment =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

TEST_F(MpiDataPlaneTest, SingleEntryOutOfPlaceLeavesInputAlone) {
  HostTensor in(DataType::kFloat32, {5, 3}), out(DataType::kFloat32, {5, 3}), orig = in;
  in.Fill(0);
  orig.Fill(0);
  auto entry = MakeEntry("grad", &in, &out);
  ASSERT_TRUE(plane_->Allreduce({entry.get()}, Spec(DataType::kFloat32, ReduceOp::kSum)).ok());
  ExpectScaled(out, orig, 1.0);
  ExpectScaled(in, orig, 1.0);
}

TEST_F(MpiDataPlaneTest, SingleEntryScalesInAndOutOfPlace) {
  for (bool in_place : {true, false}) {
    HostTensor in(DataType::kFloat32, {33}), out(DataType::kFloat32, {33}), orig = in;
    in.Fill(0);
    orig.Fill(0);
    auto entry = MakeEntry("w", &in, in_place ? &in : &out);
    const Status s =
        plane_->Allreduce({entry.get()}, Spec(DataType::kFloat32, ReduceOp::kSum, 2, 0.5));
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectScaled(in_place ? in : out, orig, 1.0);
    auto scaled = MakeEntry("w", &in, in_place ? &in : &out);
    ASSERT_TRUE(
        plane_->Allreduce({scaled.get()}, Spec(DataType::kFloat32, ReduceOp::kSum, 2, 3)).ok());
    ExpectScaled(in_place ? in : out, orig, 6.0);
    if (!in_place) ExpectScaled(in, orig, 1.0);
  }
}

TEST_F(MpiDataPlaneTest, AverageDividesBySize) {
  HostTensor in(DataType::kFloat64, {4}), orig = in;
  in.Fill(0);
  orig.Fill(0);
  auto entry = MakeEntry("avg", &in, &in);
  ASSERT_TRUE(
      plane_->Allreduce({entry.get()}, Spec(DataType::kFloat64, ReduceOp::kAverage, 1, 0.5)).ok());
  ExpectScaled(in, orig, 0.5);  // one rank: the average is the value itself
}

TEST_F(MpiDataPlaneTest, ZeroElementsAreANoOp) {
  TensorEntry entry;
  entry.name = "empty";
  entry.input = TensorView(nullptr, DataType::kFloat32, {0, 4});
  entry.output = entry.input;
  EXPECT_TRUE(plane_->Allreduce({&entry}, Spec(DataType::kFloat32, ReduceOp::kSum, 2, 2)).ok());
}

// Sizes chosen to cover empty, single-element, odd and multi-block entries, some in place.
void RunFused(MpiDataPlane* plane, DataType dtype, ReduceOp op) {
  SCOPED_TRACE(DataTypeName(dtype) + " " + ReduceOpName(op));
  const std::vector<int64_t> sizes = {0, 1, 3, 17, 100, 7, 64};
  std::vector<HostTensor> inputs, outputs, originals;
  for (size_t i = 0; i < sizes.size(); ++i) {
    inputs.emplace_back(dtype, std::vector<int64_t>{sizes[i]});
    inputs.back().Fill(static_cast<double>(i));
    originals.push_back(inputs.back());
    outputs.emplace_back(dtype, std::vector<int64_t>{sizes[i]});
  }
  std::vector<std::unique_ptr<TensorEntry>> owned;
  std::vector<TensorEntry*> entries;
  for (size_t i = 0; i < sizes.size(); ++i) {
    HostTensor* out = i % 2 ? &inputs[i] : &outputs[i];
    owned.push_back(MakeEntry("t" + std::to_string(i), &inputs[i], out));
    entries.push_back(owned.back().get());
  }
  const Status s = plane->Allreduce(entries, Spec(dtype, op, 3, 0.5));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const HostTensor& result = i % 2 ? inputs[i] : outputs[i];
    for (int64_t k = 0; k < sizes[i]; ++k) {
      const double pre = originals[i].Get(k) * 3;  // exact in every dtype for these values
      const double expected = IsFloatingPoint(dtype) ? pre * 0.5 : std::trunc(pre * 0.5);
      ASSERT_EQ(result.Get(k), expected) << "tensor " << i << " element " << k;
    }
    if (i % 2 == 0) ExpectScaled(inputs[i], originals[i], 1.0);
  }
}

TEST_F(MpiDataPlaneTest, FusedEntriesEveryDtypeAndOp) {
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      RunFused(plane_.get(), dtype, op);
    }
  }
}

TEST_F(MpiDataPlaneTest, SingleEntryEveryDtype) {
  for (DataType dtype : kAllTypes) {
    SCOPED_TRACE(DataTypeName(dtype));
    HostTensor in(dtype, {2, 9}), out(dtype, {2, 9}), orig = in;
    in.Fill(1);
    orig.Fill(1);
    auto entry = MakeEntry("x", &in, &out);
    const Status s = plane_->Allreduce({entry.get()}, Spec(dtype, ReduceOp::kSum, 2, 1));
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectScaled(out, orig, 2.0);
  }
}

TEST_F(MpiDataPlaneTest, BucketDtypeMismatchNamesTensor) {
  HostTensor in(DataType::kInt32, {3});
  auto entry = MakeEntry("layer1.bias", &in, &in);
  const Status s = plane_->Allreduce({entry.get()}, Spec(DataType::kFloat32, ReduceOp::kSum));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer1.bias"), std::string::npos) << s.message();
}

TEST_F(MpiDataPlaneTest, DeviceTensorIsRefused) {
  HostTensor in(DataType::kFloat32, {3});
  auto entry = MakeEntry("on_gpu", &in, &in);
  entry->input.device = Device::Cuda(0);
  entry->output.device = Device::Cuda(0);
  const Status s = plane_->Allreduce({entry.get()}, Spec(DataType::kFloat32, ReduceOp::kSum));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("on_gpu"), std::string::npos) << s.message();
}

// One rank never calls the reduction function, so apply the float16/bfloat16 ops locally.
TEST_F(MpiDataPlaneTest, HalfPrecisionOpsReduceThroughMpi) {
  struct Case {
    ReduceOp op;
    std::vector<float> expected;
  };
  const std::vector<float> a = {1, -2, 3.5}, b = {0.5, 4, -1};
  const Case cases[] = {{ReduceOp::kSum, {1.5, 2, 2.5}},
                        {ReduceOp::kMin, {0.5, -2, -1}},
                        {ReduceOp::kMax, {1, 4, 3.5}},
                        {ReduceOp::kProduct, {0.5, -8, -3.5}}};
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(DataTypeName(dtype) + " " + ReduceOpName(c.op));
      HostTensor in(dtype, {3}), inout(dtype, {3});
      for (int i = 0; i < 3; ++i) {
        in.Set(i, a[i]);
        inout.Set(i, b[i]);
      }
      MPI_Op op = MPI_OP_NULL;
      ASSERT_TRUE(MpiReduceOpOf(dtype, c.op, &op).ok());
      ASSERT_EQ(MPI_Reduce_local(in.View().data, inout.View().data, 3, MpiDatatypeOf(dtype), op),
                MPI_SUCCESS);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(inout.Get(i), c.expected[i]) << i;
    }
  }
}

TEST_F(MpiDataPlaneTest, NativeTypesMapToMpiBuiltins) {
  MPI_Op op = MPI_OP_NULL;
  ASSERT_TRUE(MpiReduceOpOf(DataType::kInt64, ReduceOp::kAverage, &op).ok());
  EXPECT_EQ(op, MPI_SUM);
  ASSERT_TRUE(MpiReduceOpOf(DataType::kFloat32, ReduceOp::kProduct, &op).ok());
  EXPECT_EQ(op, MPI_PROD);
  EXPECT_EQ(MpiDatatypeOf(DataType::kUInt8), MPI_UINT8_T);
  EXPECT_EQ(MpiDatatypeOf(DataType::kFloat64), MPI_DOUBLE);
  int size = 0;
  MPI_Type_size(MpiDatatypeOf(DataType::kBFloat16), &size);
  EXPECT_EQ(size, 2);
  EXPECT_FALSE(MpiReduceOpOf(DataType::kFloat32, static_cast<ReduceOp>(99), &op).ok());
}

}  // namespace
}  // namespace mpi_plane_test
}  // namespace gradsync
