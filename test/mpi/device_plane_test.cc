// The device plane's logic over the host backend (a thread as the communication stream, MPI as
// the collective library), at 1, 2 and 4 ranks: fusion and the batched copy's scaling for every
// dtype and reduce op, every collective, readiness waits on a slow producer, stream-ordered
// completion and the finalizer's completion (where a bucket's tensors are reduced as they lie:
// device_plane_layout_test.cc; its failures: device_plane_failure_test.cc).
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/finalizer.h"
#include "ops/device/producer_readiness.h"
#include "runtime/host_stream.h"
#include "test/mpi/device_plane_fixture.h"

namespace gradsync {
namespace testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST_F(DevicePlaneTest, AllreduceEveryDtypeAndOpFusedAndAlone) {
  for (DataType dtype : AllDataTypes()) {
    for (ReduceOp op : kAllReduceOps) {
      // Sizes around the copy's chunks and vectors, and an empty tensor among them.
      std::vector<std::unique_ptr<Op>> ops;
      for (int64_t n : {int64_t{3}, int64_t{0}, int64_t{4097}, int64_t{20000}}) {
        ops.push_back(
            std::make_unique<Op>("t" + std::to_string(n), dtype, std::vector<int64_t>{n}));
        Fill(&ops.back()->input, op, rank_);
      }
      ops[2]->OutOfPlace();
      std::vector<TensorEntry*> fused;
      for (auto& o : ops) fused.push_back(&o->entry);
      ASSERT_TRUE(plane_->Allreduce(fused, {dtype, op}).ok());
      ASSERT_TRUE(Finish().ok());
      for (size_t i = 0; i < ops.size(); ++i) {
        const HostTensor& out = i == 2 ? ops[i]->result : ops[i]->input;
        EXPECT_TRUE(Reduced(out, op, dtype, size_)) << "fused, tensor " << i;
      }
      Op alone("alone", dtype, {1000});
      Fill(&alone.input, op, rank_);
      ASSERT_TRUE(plane_->Allreduce({&alone.entry}, {dtype, op}).ok());
      ASSERT_TRUE(Finish().ok());
      EXPECT_TRUE(Reduced(alone.input, op, dtype, size_)) << "alone";
    }
  }
}

TEST_F(DevicePlaneTest, ScalesAreFoldedIntoTheCopies) {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                         DataType::kFloat64, DataType::kInt32}) {
    for (bool fused : {false, true}) {
      Op a("a", dtype, {777});
      Op b("b", dtype, {5});
      Fill(&a.input, ReduceOp::kSum, rank_);
      Fill(&b.input, ReduceOp::kSum, rank_);
      a.OutOfPlace();
      std::vector<TensorEntry*> entries{&a.entry};
      if (fused) entries.push_back(&b.entry);
      // prescale 4, postscale 0.25 and the average's 1/size: the sum divided by size.
      ASSERT_TRUE(plane_->Allreduce(entries, {dtype, ReduceOp::kAverage, 4.0, 0.25}).ok());
      ASSERT_TRUE(Finish().ok());
      EXPECT_TRUE(Reduced(a.result, ReduceOp::kAverage, dtype, size_)) << fused;
      if (fused) {
        EXPECT_TRUE(Reduced(b.input, ReduceOp::kAverage, dtype, size_));
      }
    }
  }
}

TEST_F(DevicePlaneTest, WaitsOnTheStreamForASlowProducer) {
  Op op("late", DataType::kFloat32, {4096});
  HostStream producer;
  // The producer writes the input only after a while; until then the input holds garbage.
  for (int64_t i = 0; i < op.input.size(); ++i) op.input.Set(i, -1000);
  producer.Enqueue([&] {
    std::this_thread::sleep_for(milliseconds(300));
    Fill(&op.input, ReduceOp::kSum, rank_);
  });
  op.entry.ready = producer.Record();
  ASSERT_TRUE(plane_->Allreduce({&op.entry}, {DataType::kFloat32, ReduceOp::kSum}).ok());
  // Launching did not wait for the producer.
  EXPECT_FALSE(op.entry.ready->Query());
  ASSERT_TRUE(Finish().ok());
  EXPECT_TRUE(Reduced(op.input, ReduceOp::kSum, DataType::kFloat32, size_));
}

// Readiness recorded on a host stream whose address stands in for a cudaStream_t, counted; or
// failing, while `fail_records` is set.
std::atomic<int> records{0};
std::atomic<bool> fail_records{false};
Status RecordOnHostStream(void* stream, int, std::shared_ptr<StreamEvent>* ready) {
  if (fail_records) return Status(StatusCode::kCudaError, "the recorder fails");
  records.fetch_add(1);
  *ready = static_cast<HostStream*>(stream)->Record();
  return Status::OK();
}

// A locked bucket's entries come to the plane with their producer's stream still unrecorded: the
// launch records one event per stream for all of them, the stream waits for it, the host does not.
TEST_F(DevicePlaneTest, ALaunchRecordsItsEntriesProducersOncePerStream) {
  SetReadinessRecorderForTesting(&RecordOnHostStream);
  HostStream first_producer, second_producer;
  std::vector<std::unique_ptr<Op>> ops;
  for (int i = 0; i < 4; ++i) {
    ops.push_back(std::make_unique<Op>("unrecorded." + std::to_string(i), DataType::kFloat32,
                                       std::vector<int64_t>{1000 + i}));
    for (int64_t k = 0; k < ops.back()->input.size(); ++k) ops.back()->input.Set(k, -1000);
    ops.back()->entry.ready_stream = i < 3 ? &first_producer : &second_producer;
  }
  // The first producer writes the first three inputs, the second the last, after a while.
  for (HostStream* producer : {&first_producer, &second_producer}) {
    const int begin = producer == &first_producer ? 0 : 3;
    const int end = producer == &first_producer ? 3 : 4;
    producer->Enqueue([&ops, begin, end, this] {
      std::this_thread::sleep_for(milliseconds(300));
      for (int i = begin; i < end; ++i) Fill(&ops[i]->input, ReduceOp::kSum, rank_);
    });
  }
  records = 0;
  std::vector<TensorEntry*> entries;
  for (auto& op : ops) entries.push_back(&op->entry);
  const Status launched = plane_->Allreduce(entries, {DataType::kFloat32, ReduceOp::kSum});
  SetReadinessRecorderForTesting(nullptr);
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  EXPECT_EQ(records.load(), 2) << "one record per producer stream";
  for (auto& op : ops) {
    EXPECT_EQ(op->entry.ready_stream, nullptr) << op->entry.name;
    ASSERT_NE(op->entry.ready, nullptr) << op->entry.name;
    EXPECT_FALSE(op->entry.ready->Query()) << "the launch waited for " << op->entry.name;
  }
  ASSERT_TRUE(Finish().ok());
  for (auto& op : ops) EXPECT_TRUE(Reduced(op->input, ReduceOp::kSum, DataType::kFloat32, size_));
}

// A producer's stream that cannot be recorded on fails the launch and aborts the plane, as a
// failed launch does: the other ranks go on into the collective, and must see this rank's failure.
TEST_F(DevicePlaneTest, AProducerThatCannotBeRecordedOnAbortsThePlane) {
  if (size_ > 1) GTEST_SKIP() << "one rank alone fails; the others would wait in the collective";
  SetReadinessRecorderForTesting(&RecordOnHostStream);
  fail_records = true;
  HostStream producer;
  Op op("unrecordable", DataType::kFloat32, {64});
  op.entry.ready_stream = &producer;
  const Status launched = plane_->Allreduce({&op.entry}, {DataType::kFloat32, ReduceOp::kSum});
  fail_records = false;
  SetReadinessRecorderForTesting(nullptr);
  ASSERT_FALSE(launched.ok());
  EXPECT_NE(launched.message().find("recording the producer's readiness"), std::string::npos)
      << launched.ToString();
  EXPECT_NE(launched.message().find("unrecordable"), std::string::npos) << launched.ToString();
  Op later("later", DataType::kFloat32, {64});
  EXPECT_FALSE(plane_->Allreduce({&later.entry}, {DataType::kFloat32, ReduceOp::kSum}).ok())
      << "the plane should be aborted";
}

TEST_F(DevicePlaneTest, StreamOrderedCompletionOrdersAConsumerAfterTheReduction) {
  Op op("ordered", DataType::kFloat64, {1000});
  HostStream producer;
  producer.Enqueue([&] {
    std::this_thread::sleep_for(milliseconds(200));
    Fill(&op.input, ReduceOp::kSum, rank_);
  });
  op.entry.ready = producer.Record();
  ASSERT_TRUE(plane_->Allreduce({&op.entry}, {DataType::kFloat64, ReduceOp::kSum}).ok());
  std::shared_ptr<StreamEvent> done = plane_->TakeCompletion();
  // The consumer's stream waits for the launched event; its work reads the result.
  bool timed_out = true;
  std::shared_ptr<StreamEvent> launched = op.entry.state->WaitLaunched(seconds(10), &timed_out);
  ASSERT_FALSE(timed_out);
  ASSERT_EQ(launched, done);
  HostStream consumer;
  consumer.WaitFor(launched);
  std::atomic<double> seen{-1};
  consumer.Enqueue([&] { seen = op.input.Get(999); });
  ASSERT_TRUE(consumer.Record()->Wait(kWaitLimit).ok());
  EXPECT_EQ(seen.load(), Expected(ReduceOp::kSum, DataType::kFloat64, size_, 999));
}

TEST_F(DevicePlaneTest, AllgatherOfVariableFirstDimensions) {
  const int64_t mine = rank_ + 1;  // rank r gives r + 1 rows of 3
  Op op("gather", DataType::kInt32, {mine, 3});
  for (int64_t i = 0; i < op.input.size(); ++i) op.input.Set(i, rank_ * 100 + i);
  std::vector<int64_t> first_dims;
  for (int r = 0; r < size_; ++r) first_dims.push_back(r + 1);
  std::unique_ptr<HostTensor> out;
  op.entry.allocator = Into(&out);
  ASSERT_TRUE(plane_->Allgather(&op.entry, first_dims).ok());
  ASSERT_TRUE(Finish().ok());
  ASSERT_NE(out, nullptr);
  int64_t at = 0;
  for (int r = 0; r < size_; ++r) {
    for (int64_t i = 0; i < (r + 1) * 3; ++i) EXPECT_EQ(out->Get(at++), r * 100 + i);
  }
  EXPECT_EQ(op.entry.state->output_shape, (std::vector<int64_t>{size_ * (size_ + 1) / 2, 3}));
}

TEST_F(DevicePlaneTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < size_; ++root) {
    Op op("bcast", DataType::kBFloat16, {33});
    for (int64_t i = 0; i < op.input.size(); ++i) op.input.Set(i, rank_ == root ? i : -1);
    ASSERT_TRUE(plane_->Broadcast(&op.entry, root).ok());
    ASSERT_TRUE(Finish().ok());
    for (int64_t i = 0; i < op.input.size(); ++i) EXPECT_EQ(op.input.Get(i), i);
  }
}

TEST_F(DevicePlaneTest, AlltoallWithSplits) {
  // Rank r sends q + 1 rows (of 2) to rank q.
  std::vector<int64_t> splits;
  int64_t rows = 0;
  for (int q = 0; q < size_; ++q) {
    splits.push_back(q + 1);
    rows += q + 1;
  }
  Op op("a2a", DataType::kInt64, {rows, 2});
  for (int64_t i = 0; i < op.input.size(); ++i) op.input.Set(i, rank_ * 1000 + i);
  op.entry.splits = splits;
  std::unique_ptr<HostTensor> out;
  op.entry.allocator = Into(&out);
  ASSERT_TRUE(plane_->Alltoall(&op.entry).ok());
  ASSERT_TRUE(Finish().ok());
  EXPECT_EQ(op.entry.state->received_splits, std::vector<int64_t>(size_, rank_ + 1));
  ASSERT_NE(out, nullptr);
  int64_t at = 0;
  const int64_t first_row = rank_ * (rank_ + 1) / 2;  // rows sent to ranks before this one
  for (int r = 0; r < size_; ++r) {
    for (int64_t i = 0; i < (rank_ + 1) * 2; ++i) {
      EXPECT_EQ(out->Get(at++), r * 1000 + first_row * 2 + i);
    }
  }
}

TEST_F(DevicePlaneTest, ReducescatterFusedWithUnevenRowsAndAlone) {
  for (bool fused : {false, true}) {
    Op a("rs.a", DataType::kFloat32, {2 * size_ + 1, 3});  // a remainder row for rank 0
    Op b("rs.b", DataType::kFloat32, {1});                 // fewer rows than ranks
    Fill(&a.input, ReduceOp::kSum, rank_);
    Fill(&b.input, ReduceOp::kSum, rank_);
    std::unique_ptr<HostTensor> out_a;
    std::unique_ptr<HostTensor> out_b;
    a.entry.allocator = Into(&out_a);
    b.entry.allocator = Into(&out_b);
    std::vector<TensorEntry*> entries{&a.entry};
    if (fused) entries.push_back(&b.entry);
    std::vector<LocalFailure> failures;
    const double prescale = fused ? 2.0 : 1.0;
    ASSERT_TRUE(
        plane_
            ->Reducescatter(entries, {DataType::kFloat32, ReduceOp::kSum, prescale, 0.5}, &failures)
            .ok());
    ASSERT_TRUE(Finish().ok());
    EXPECT_TRUE(failures.empty());
    const std::vector<int64_t> rows = EvenSplits(2 * size_ + 1, size_);
    int64_t first = 0;
    for (int r = 0; r < rank_; ++r) first += rows[r] * 3;
    ASSERT_NE(out_a, nullptr);
    ASSERT_EQ(out_a->size(), rows[rank_] * 3);
    for (int64_t i = 0; i < out_a->size(); ++i) {
      EXPECT_EQ(out_a->Get(i),
                Expected(ReduceOp::kSum, DataType::kFloat32, size_, first + i) * prescale * 0.5);
    }
    if (fused) {
      const int64_t b_rows = EvenSplits(1, size_)[rank_];
      if (b_rows == 1) {
        ASSERT_NE(out_b, nullptr);
        EXPECT_EQ(out_b->Get(0), Expected(ReduceOp::kSum, DataType::kFloat32, size_, 0));
      }
      EXPECT_EQ(b.entry.state->output_shape, std::vector<int64_t>{b_rows});
    }
  }
}

TEST_F(DevicePlaneTest, JoinedRanksStandInHoldsTheIdentity) {
  // Every rank takes part through a stand-in moved into the backend's memory.
  std::vector<float> identity(100, 1.0f);  // the product's identity
  TensorEntry stand_in;
  stand_in.name = "stand-in";
  stand_in.input = TensorView(identity.data(), DataType::kFloat32, {100});
  stand_in.output = stand_in.input;
  ASSERT_TRUE(plane_->AdoptStandIn(&stand_in).ok());
  EXPECT_NE(stand_in.input.data, identity.data());
  ASSERT_TRUE(plane_->Allreduce({&stand_in}, {DataType::kFloat32, ReduceOp::kProduct}).ok());
  ASSERT_TRUE(Finish().ok());
  EXPECT_EQ(static_cast<float*>(stand_in.output.data)[7], 1.0f);
  plane_->ReleaseStandIns();
}

TEST_F(DevicePlaneTest, FinalizerCompletesLaunchedBucketsInOrder) {
  std::mutex mu;
  std::vector<std::string> completed;
  Finalizer finalizer([&](const std::vector<TensorEntry*>& entries, const Status& status) {
    std::lock_guard<std::mutex> lock(mu);
    for (TensorEntry* entry : entries) {
      completed.push_back(entry->name + (status.ok() ? "" : " failed"));
      entry->state->Record(status);
    }
    OpState::AnnounceCompletions();
  });
  std::vector<std::unique_ptr<Op>> ops;
  for (int i = 0; i < 20; ++i) {
    ops.push_back(std::make_unique<Op>("op" + std::to_string(i), DataType::kFloat32,
                                       std::vector<int64_t>{64 + i}));
    Fill(&ops.back()->input, ReduceOp::kSum, rank_);
    ASSERT_TRUE(plane_->Allreduce({&ops.back()->entry}, {DataType::kFloat32, ReduceOp::kSum}).ok());
    finalizer.Add(plane_.get(), 0, {&ops.back()->entry}, plane_->TakeCompletion());
  }
  finalizer.Drain();
  EXPECT_EQ(finalizer.pending(), 0u);
  ASSERT_EQ(completed.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(completed[i], "op" + std::to_string(i));
    EXPECT_TRUE(Reduced(ops[i]->input, ReduceOp::kSum, DataType::kFloat32, size_));
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
