// Device tensors through the whole path when each rank has a GPU of its own: the plane each rank
// reduces on, and the one GPU a process may use.
#include <unistd.h>

#include <cstdlib>

#include <memory>
#include <string>
#include <vector>

#include "test/mpi/device_loop_fixture.h"

namespace gradsync {
namespace testing {
namespace {

// One GPU per rank, as on a node with several (rank r's tensors on cuda:r): the responses carry
// rank 0's device, yet each rank reduces on its own GPU's plane (a plane for rank 0's would read
// another GPU's memory, and take the ranks for sharing one), its cached tensors match every
// step, and the schedule locks; a joined rank's stand-ins go to its own plane too.
TEST_F(DeviceLoopTest, EachRankReducesOnItsOwnGpu) {
  const fs::path path =
      fs::temp_directory_path() / ("gradsync_device_own_" + std::to_string(getpid()) + ".json");
  start_timeline(path.string());
  planes_made_for.clear();
  for (int step = 0; step < 8; ++step) {
    std::vector<std::unique_ptr<HostTensor>> grads;
    std::vector<Handle> handles;
    for (int g = 0; g < 4; ++g) {
      grads.push_back(std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{33}));
      for (int64_t k = 0; k < 33; ++k) grads.back()->Set(k, rank_ + step + g);
      AllreduceOptions options;
      options.name = "own.gpu." + std::to_string(g);
      handles.push_back(allreduce(OnDevice(grads.back().get(), rank_), options));
    }
    for (size_t g = 0; g < handles.size(); ++g) {
      ASSERT_TRUE(Succeeds(handles[g])) << "step " << step;
      ASSERT_EQ(grads[g]->Get(5), size_ * (size_ - 1) / 2.0 + size_ * (step + g));
    }
  }
  // The last rank joins early: the others' next step goes on with its stand-ins.
  HostTensor last(DataType::kFloat32, {33});
  for (int64_t k = 0; k < 33; ++k) last.Set(k, 1);
  if (rank_ != size_ - 1) {
    AllreduceOptions options;
    options.name = "own.gpu.after";
    Handle h = allreduce(OnDevice(&last, rank_), options);
    ASSERT_TRUE(Succeeds(h));
    EXPECT_EQ(last.Get(0), size_ - 1);
  }
  join();
  stop_timeline();
  ASSERT_FALSE(planes_made_for.empty());
  for (const Device& device : planes_made_for) {
    EXPECT_EQ(device, Device::Cuda(rank_)) << "a plane for " << DeviceName(device);
  }
  if (rank_ != 0) return;
  const Trace trace = LoadTrace(path);
  fs::remove(path);
  ASSERT_TRUE(trace.ok);
  EXPECT_EQ(LocksOfTheGlobalSet(trace), 1u) << "the loop locked";
}

// One GPU a process: a rank's device planes are made collectively when first used, and buckets
// fuse device tensors by kind, so a tensor on a second device would reach a plane or a bucket the
// other ranks lack (a hang). Refused at its enqueue instead, naming both devices; the first
// device goes on working.
TEST_F(DeviceLoopTest, ATensorOnASecondGpuIsRefusedAtEnqueue) {
  HostTensor first(DataType::kFloat32, {8}), second(DataType::kFloat32, {8});
  for (int64_t k = 0; k < 8; ++k) first.Set(k, 1);
  AllreduceOptions own, another;
  own.name = "on.own.gpu";
  another.name = "on.another.gpu";
  ASSERT_TRUE(Succeeds(allreduce(OnDevice(&first, rank_), own)));
  EXPECT_TRUE(ThrowsWith(
      [&] { allreduce(OnDevice(&second, rank_ + 1), another); }, StatusCode::kInvalidArgument,
      "on cuda:" + std::to_string(rank_ + 1) +
          ", but this process's device operations run on cuda:" + std::to_string(rank_)));
  ASSERT_TRUE(Succeeds(allreduce(OnDevice(&first, rank_), own)));
  EXPECT_EQ(first.Get(3), size_ * size_);
}

// A rank that joins before its first device tensor makes its plane for its stand-ins on the GPU
// chosen for it (GRADSYNC_GPU_DEVICE here, as init's gpu_device() on a node with GPUs), not on
// rank 0's: the ranks would be taken for sharing one GPU, and its own first tensor would ask for
// a second plane alone, a collective no other rank enters.
class JoinBeforeAnyDeviceTensorTest : public DeviceLoopTest {
 protected:
  void SetUp() override {
    // init() takes GRADSYNC_GPU_DEVICE only among the visible GPUs: where there are any, the
    // host backend's labels cannot name rank r's GPU r.
    int gpus = 0;
    if (UsableCudaDevices(&gpus)) GTEST_SKIP() << "for hosts without a visible GPU";
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    setenv("GRADSYNC_GPU_DEVICE", std::to_string(rank).c_str(), 1);
    DeviceLoopTest::SetUp();
  }
  void TearDown() override {
    DeviceLoopTest::TearDown();
    unsetenv("GRADSYNC_GPU_DEVICE");
  }
};

TEST_F(JoinBeforeAnyDeviceTensorTest, StandInsGoToThisRanksOwnGpu) {
  planes_made_for.clear();
  HostTensor early(DataType::kFloat32, {9});
  for (int64_t k = 0; k < 9; ++k) early.Set(k, 1);
  if (rank_ != size_ - 1) {
    AllreduceOptions options;
    options.name = "before.the.join";
    ASSERT_TRUE(Succeeds(allreduce(OnDevice(&early, rank_), options)));
    EXPECT_EQ(early.Get(8), size_ - 1);
  }
  join();
  HostTensor after(DataType::kFloat32, {9});
  for (int64_t k = 0; k < 9; ++k) after.Set(k, rank_ + 1);
  AllreduceOptions options;
  options.name = "after.the.join";
  ASSERT_TRUE(Succeeds(allreduce(OnDevice(&after, rank_), options)));
  EXPECT_EQ(after.Get(8), size_ * (size_ + 1) / 2);
  for (const Device& device : planes_made_for) {
    EXPECT_EQ(device, Device::Cuda(rank_)) << "a plane for " << DeviceName(device);
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
