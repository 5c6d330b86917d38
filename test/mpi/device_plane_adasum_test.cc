// The device plane's Adasum buckets over the host backend: the phases each layout takes, and a
// slow producer waited for on the stream before the host side reads the bucket.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/host_stream.h"
#include "test/mpi/adasum_reference.h"
#include "test/mpi/device_plane_fixture.h"

namespace gradsync {
namespace testing {
namespace {

::testing::AssertionResult IsTheTree(const HostTensor& tensor, int size, int t) {
  const Vector want = Reference(size, t, tensor.size());
  for (int64_t i = 0; i < tensor.size(); ++i) {
    if (std::fabs(tensor.Get(i) - want[i]) > 1e-5 * (1 + std::fabs(want[i]))) {
      return ::testing::AssertionFailure() << "tensor " << t << ", element " << i << ": "
                                           << tensor.Get(i) << ", wanted " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// In place alone: combined where it lies. Out of place alone: copied into the output first.
// Fused (sizes off the 16-byte boundaries): in through the fusion buffer and out again.
TEST_F(DevicePlaneTest, AdasumBucketsTakeTheirLayoutsPhases) {
  const ReduceSpec spec{DataType::kFloat32, ReduceOp::kAdasum};
  plane_->RecordPhases(true);

  Op alone("alone", DataType::kFloat32, {1000});
  for (int64_t i = 0; i < alone.input.size(); ++i) alone.input.Set(i, Input(rank_, 0, i));
  ASSERT_TRUE(plane_->Allreduce({&alone.entry}, spec).ok());
  ASSERT_TRUE(Finish().ok());
  EXPECT_EQ(Labels(plane_->TakePhases()),
            (std::vector<std::string>{"DEVICE_QUEUE", "DEVICE_ADASUM"}));
  EXPECT_TRUE(IsTheTree(alone.input, size_, 0));

  Op apart("apart", DataType::kFloat32, {1000});
  for (int64_t i = 0; i < apart.input.size(); ++i) apart.input.Set(i, Input(rank_, 1, i));
  apart.OutOfPlace();
  ASSERT_TRUE(plane_->Allreduce({&apart.entry}, spec).ok());
  ASSERT_TRUE(Finish().ok());
  EXPECT_EQ(Labels(plane_->TakePhases()),
            (std::vector<std::string>{"DEVICE_QUEUE", "DEVICE_COPY_IN", "DEVICE_ADASUM"}));
  EXPECT_TRUE(IsTheTree(apart.result, size_, 1));
  EXPECT_EQ(apart.input.Get(3), static_cast<float>(Input(rank_, 1, 3))) << "the input must stay";

  Op first("first", DataType::kFloat32, {7});
  Op second("second", DataType::kFloat32, {33});
  for (int64_t i = 0; i < 7; ++i) first.input.Set(i, Input(rank_, 2, i));
  for (int64_t i = 0; i < 33; ++i) second.input.Set(i, Input(rank_, 3, i));
  ASSERT_TRUE(plane_->Allreduce({&first.entry, &second.entry}, spec).ok());
  ASSERT_TRUE(Finish().ok());
  EXPECT_EQ(Labels(plane_->TakePhases()),
            (std::vector<std::string>{"DEVICE_QUEUE", "DEVICE_COPY_IN", "DEVICE_ADASUM",
                                      "DEVICE_COPY_OUT"}));
  EXPECT_TRUE(IsTheTree(first.input, size_, 2));
  EXPECT_TRUE(IsTheTree(second.input, size_, 3));
  plane_->RecordPhases(false);
}

TEST_F(DevicePlaneTest, AdasumWaitsOnTheStreamForASlowProducer) {
  Op op("late", DataType::kFloat64, {4096});
  HostStream producer;
  // The producer writes the input only after a while; until then the input holds garbage.
  for (int64_t i = 0; i < op.input.size(); ++i) op.input.Set(i, -1000);
  producer.Enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int64_t i = 0; i < op.input.size(); ++i) op.input.Set(i, Input(rank_, 4, i));
  });
  op.entry.ready = producer.Record();
  ASSERT_TRUE(plane_->Allreduce({&op.entry}, {DataType::kFloat64, ReduceOp::kAdasum}).ok());
  EXPECT_FALSE(op.entry.ready->Query()) << "launching must not wait for the producer";
  ASSERT_TRUE(Finish().ok());
  EXPECT_TRUE(IsTheTree(op.input, size_, 4));
}

TEST_F(DevicePlaneTest, AdasumOfIntegersIsRefusedBeforeAnythingIsQueued) {
  Op ints("ints", DataType::kInt32, {8});
  const Status refused = plane_->Allreduce({&ints.entry}, {DataType::kInt32, ReduceOp::kAdasum});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("floating-point"), std::string::npos) << refused.ToString();
  // The plane is not aborted: the next bucket runs.
  Op next("next", DataType::kFloat32, {16});
  Fill(&next.input, ReduceOp::kSum, rank_);
  ASSERT_TRUE(plane_->Allreduce({&next.entry}, {DataType::kFloat32, ReduceOp::kSum}).ok());
  ASSERT_TRUE(Finish().ok());
  EXPECT_TRUE(Reduced(next.input, ReduceOp::kSum, DataType::kFloat32, size_));
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
