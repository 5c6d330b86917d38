// The device plane's failures over the host backend, at 1, 2 and 4 ranks: a producer that never
// finishes times out and aborts the plane, a fusion buffer that cannot be allocated aborts it,
// and a plane aborted while a rank is stuck inside a collective ends the job instead of hanging.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/finalizer.h"
#include "runtime/fusion_buffer.h"
#include "runtime/host_stream.h"
#include "test/mpi/device_plane_fixture.h"

namespace gradsync {
namespace testing {
namespace {

using std::chrono::milliseconds;

TEST_F(DevicePlaneTest, NeverReadyProducerTimesOutAndAbortsThePlane) {
  MakePlane(milliseconds(500));
  Status failure;
  Finalizer finalizer(
      [&](const std::vector<TensorEntry*>&, const Status& status) { failure = status; });
  Op stuck("stuck.grad", DataType::kFloat32, {16});
  stuck.entry.ready = std::make_shared<HostEvent>();  // a producer that never finishes
  ASSERT_TRUE(plane_->Allreduce({&stuck.entry}, {DataType::kFloat32, ReduceOp::kSum}).ok());
  const auto start = std::chrono::steady_clock::now();
  finalizer.Add(plane_.get(), 3, {&stuck.entry}, plane_->TakeCompletion());
  finalizer.Drain();
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(450));
  EXPECT_EQ(failure.code(), StatusCode::kTimeout) << failure.ToString();
  for (const char* needle : {"allreduce of tensor 'stuck.grad'", "process set 3",
                             "GRADSYNC_NCCL_TIMEOUT_SECONDS", "aborted"}) {
    EXPECT_NE(failure.message().find(needle), std::string::npos) << failure.message();
  }
  // Every later operation on the plane fails at once, with the same cause.
  Op later("later", DataType::kFloat32, {16});
  const Status refused = plane_->Allreduce({&later.entry}, {DataType::kFloat32, ReduceOp::kSum});
  EXPECT_EQ(refused.code(), StatusCode::kTimeout);
  EXPECT_NE(refused.message().find("stuck.grad"), std::string::npos);
}

// The host backend, but allocations of more than `limit` bytes refused.
class RefusingAllocations : public DeviceBackend {
 public:
  RefusingAllocations(std::unique_ptr<HostDeviceBackend> host, size_t limit)
      : host_(std::move(host)), limit_(limit) {}
  const char* name() const override { return "refusing"; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  Stream* stream() override { return host_->stream(); }
  Status Allocate(size_t bytes, void** ptr) override {
    if (bytes > limit_) return Status::Internal("refused " + std::to_string(bytes) + " bytes");
    return host_->Allocate(bytes, ptr);
  }
  void FreeAfterWork(void* ptr) override { host_->FreeAfterWork(ptr); }
  Status Upload(const void* host, void* dst, size_t bytes) override {
    return host_->Upload(host, dst, bytes);
  }
  Status BatchedCopy(const std::vector<CopySegment>& segments, DataType dtype) override {
    return host_->BatchedCopy(segments, dtype);
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    return host_->Allreduce(send, recv, count, dtype, op);
  }
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype) override {
    return host_->Allgatherv(send, recv, counts, dtype);
  }
  Status Broadcast(void* buffer, int64_t count, DataType dtype, int root) override {
    return host_->Broadcast(buffer, count, dtype, root);
  }
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype) override {
    return host_->Alltoallv(send, send_counts, recv, recv_counts, dtype);
  }
  Status ReduceScatterv(const void* send, void* recv, const std::vector<int64_t>& counts,
                        DataType dtype, ReduceOp op) override {
    return host_->ReduceScatterv(send, recv, counts, dtype, op);
  }
  Status Adasum(void* data, DataType dtype, int64_t count, const std::vector<ElementRange>& tensors,
                double prescale, double postscale) override {
    return host_->Adasum(data, dtype, count, tensors, prescale, postscale);
  }
  Status CheckAsyncError() override { return host_->CheckAsyncError(); }
  void Abort(const Status& status) override { host_->Abort(status); }

 private:
  std::unique_ptr<HostDeviceBackend> host_;
  size_t limit_;
};

// A fused bucket whose fusion buffer cannot be allocated fails, and aborts the plane as a failed
// launch does: its producers' waits are queued already, and the other ranks may be inside the
// collective, which this rank's next one must not pair with. (Here every rank is refused alike.)
TEST_F(DevicePlaneTest, AFusionBufferThatCannotBeAllocatedAbortsThePlane) {
  std::unique_ptr<HostDeviceBackend> host;
  ASSERT_TRUE(HostDeviceBackend::Create(MPI_COMM_WORLD, &host).ok());
  DevicePlane plane(std::make_unique<RefusingAllocations>(std::move(host), 0), MPI_COMM_WORLD,
                    std::chrono::seconds(60));
  Op first("first", DataType::kFloat32, {16});
  Op second("second", DataType::kFloat32, {16});
  const Status failed =
      plane.Allreduce({&first.entry, &second.entry}, {DataType::kFloat32, ReduceOp::kSum});
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("refused"), std::string::npos) << failed.ToString();
  // A tensor alone needs no fusion buffer, but the plane is aborted.
  Op alone("alone", DataType::kFloat32, {16});
  const Status refused = plane.Allreduce({&alone.entry}, {DataType::kFloat32, ReduceOp::kSum});
  EXPECT_EQ(refused.code(), failed.code());
  EXPECT_NE(refused.message().find("refused"), std::string::npos) << refused.ToString();
}

// The fusion buffer is asked for with room to grow; where only exactly what the bucket needs can
// be had, the plane takes that and goes on.
TEST_F(DevicePlaneTest, AFusionBufferFallsBackToExactlyWhatTheBucketNeeds) {
  std::unique_ptr<HostDeviceBackend> host;
  ASSERT_TRUE(HostDeviceBackend::Create(MPI_COMM_WORLD, &host).ok());
  // Two float32 tensors of 16 elements: 64 bytes each, back to back at 0 and 64.
  DevicePlane plane(std::make_unique<RefusingAllocations>(std::move(host), 128), MPI_COMM_WORLD,
                    std::chrono::seconds(60));
  Op first("first", DataType::kFloat32, {16});
  Op second("second", DataType::kFloat32, {16});
  Fill(&first.input, ReduceOp::kSum, rank_);
  Fill(&second.input, ReduceOp::kSum, rank_);
  const Status launched =
      plane.Allreduce({&first.entry, &second.entry}, {DataType::kFloat32, ReduceOp::kSum});
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  std::shared_ptr<StreamEvent> done = plane.TakeCompletion();
  ASSERT_NE(done, nullptr);
  ASSERT_TRUE(done->Wait(kWaitLimit).ok());
  EXPECT_TRUE(Reduced(first.input, ReduceOp::kSum, DataType::kFloat32, size_));
  EXPECT_TRUE(Reduced(second.input, ReduceOp::kSum, DataType::kFloat32, size_));
}

// Planes abort one rank at a time. An alltoall learns its receive counts in a blocking exchange
// on the host, which an aborted plane must still take part in before it fails: were it to fail
// first, its peers would wait there for good. Here rank 0's plane is aborted; its call fails, the
// others' launch, and rank 0 then joins their device collective by hand so that they complete.
TEST_F(DevicePlaneTest, AnAbortedPlaneStillTakesPartInAnAlltoallsSplitsExchange) {
  if (size_ < 2) GTEST_SKIP() << "needs a healthy peer";
  if (rank_ == 0) plane_->Abort(Status::Timeout("aborted for the test"));
  Op empty("empty.alltoall", DataType::kFloat32, {0, 3});
  const Status launched = plane_->Alltoall(&empty.entry);
  if (rank_ == 0) {
    EXPECT_EQ(launched.code(), StatusCode::kTimeout) << launched.ToString();
    const std::vector<int> zeros(static_cast<size_t>(size_), 0);
    float unused = 0;
    MPI_Alltoallv(&unused, zeros.data(), zeros.data(), MPI_FLOAT, &unused, zeros.data(),
                  zeros.data(), MPI_FLOAT, backend_->comm());
    return;
  }
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  EXPECT_TRUE(Finish().ok());
  EXPECT_EQ(empty.entry.state->received_splits, std::vector<int64_t>(size_, 0));
}

// What the stuck-collective handler was told on this rank; rank 1 also asks rank 0 to release it.
std::string g_stuck_message;
constexpr int kReleaseTag = 77;

void NoteStuckAndAskForRelease(const std::string& message) {
  g_stuck_message = message;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) MPI_Send(nullptr, 0, MPI_BYTE, 0, kReleaseTag, MPI_COMM_WORLD);
}

// Rank 0's producer never finishes, so its stream drops the allreduce the other ranks' streams
// are already inside; every rank's plane times out. Destroying such a plane cannot stop a thread
// inside MPI: the destructor names the stuck collective and ends the job (here, a handler that
// asks rank 0 to enter the collective after all, so that the test can end) instead of hanging.
TEST_F(DevicePlaneTest, AnAbortedPlaneStuckInACollectiveEndsTheJobInsteadOfHanging) {
  if (size_ < 2) GTEST_SKIP() << "needs a rank to be stuck waiting for another";
  MakePlane(milliseconds(500), milliseconds(300));
  HostDeviceBackend::SetStuckCollectiveHandlerForTesting(&NoteStuckAndAskForRelease);
  struct DefaultHandlerAfter {
    ~DefaultHandlerAfter() { HostDeviceBackend::SetStuckCollectiveHandlerForTesting(nullptr); }
  } restore_handler;
  g_stuck_message.clear();
  Status failure;
  Finalizer finalizer(
      [&](const std::vector<TensorEntry*>&, const Status& status) { failure = status; });
  // Two tensors: the others are stuck reducing the fusion buffer, which the plane's destructor
  // hands back before the backend's destructor waits (a use after free under the sanitizers if
  // it were freed then).
  Op a("half.stuck.a", DataType::kFloat32, {16}), b("half.stuck.b", DataType::kFloat32, {16});
  if (rank_ == 0) a.entry.ready = std::make_shared<HostEvent>();  // never finishes
  ASSERT_TRUE(plane_->Allreduce({&a.entry, &b.entry}, {DataType::kFloat32, ReduceOp::kSum}).ok());
  finalizer.Add(plane_.get(), 0, {&a.entry, &b.entry}, plane_->TakeCompletion());
  finalizer.Drain();
  EXPECT_EQ(failure.code(), StatusCode::kTimeout) << failure.ToString();
  if (rank_ == 0) {
    // Enters the collective the others are stuck in once rank 1's destructor has given up on it.
    const MPI_Comm comm = backend_->comm();
    MPI_Recv(nullptr, 0, MPI_BYTE, 1, kReleaseTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    const size_t fused =
        AlignFusionOffset(AlignFusionOffset(16 * sizeof(float)) + 16 * sizeof(float));
    std::vector<float> zeros(fused / sizeof(float), 0.0f);
    MPI_Allreduce(MPI_IN_PLACE, zeros.data(), static_cast<int>(zeros.size()), MPI_FLOAT, MPI_SUM,
                  comm);
  }
  const auto start = std::chrono::steady_clock::now();
  plane_.reset();
  if (rank_ == 0) {
    EXPECT_TRUE(g_stuck_message.empty()) << "its stream dropped the allreduce: " << g_stuck_message;
    return;
  }
  // Rank 1's handler releases every rank: the others may be released before their own limit.
  if (rank_ != 1) return;
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(250));
  for (const char* needle : {"MPI_Allreduce", "half.stuck", "another rank", "the job ends"}) {
    EXPECT_NE(g_stuck_message.find(needle), std::string::npos) << g_stuck_message;
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
