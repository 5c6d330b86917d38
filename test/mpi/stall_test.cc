// A rank that never submits a tensor produces the stall error on every rank instead of a hang, and
// ranks waiting on it sleep rather than spin. Run with short stall settings (see CMakeLists.txt).
#include <ctime>
#include <thread>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double WallSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

class StallTest : public MultiRankTest {};

TEST_F(StallTest, MissingRankFailsEveryPendingHandleWithoutSpinning) {
  if (size_ < 2) GTEST_SKIP() << "a single rank cannot stall";
  const int missing = size_ - 1;
  float x[8] = {}, only_here[8] = {};
  Handle h;
  if (rank_ != missing) {
    h = allreduce(TensorView(x, DataType::kFloat32, {8}),
                  {"stall.x", ReduceOp::kSum, 1, 1, {}, {}, {}});
  } else {
    // Waits for a tensor no other rank submits, so this rank's handle is stuck too.
    h = allreduce(TensorView(only_here, DataType::kFloat32, {8}),
                  {"stall.only_on_last", ReduceOp::kSum, 1, 1, {}, {}, {}});
  }
  const double cpu0 = ProcessCpuSeconds(), wall0 = WallSeconds();
  EXPECT_TRUE(FailsWith(h, StatusCode::kStalled, "missing on rank"));
  const double cpu = ProcessCpuSeconds() - cpu0, wall = WallSeconds() - wall0;
  EXPECT_GT(wall, 1.0) << "the stall shutdown fired too early";
  // Waiting on a stalled peer must not burn a core: spinning would be ~1.0. The rounds that go on
  // meanwhile, one a cycle time apart, each a few wake-ups of the background thread, cost about a
  // tenth of a core at 4 ranks on 2 cores, and a fifth under AddressSanitizer on a slow machine.
  EXPECT_LT(cpu / wall, 0.35) << cpu << " s of CPU in " << wall << " s of waiting";
  if (rank_ == 0) {
    std::string message;
    try {
      h.wait();
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("'stall.x'"), std::string::npos) << message;
    EXPECT_NE(message.find("missing on rank " + std::to_string(missing)), std::string::npos)
        << message;
  }
  // After a stall shutdown, new work is refused with the same explanation.
  EXPECT_TRUE(ThrowsWith([&] { allreduce(TensorView(x, DataType::kFloat32, {8})); },
                         StatusCode::kStalled, "stalled"));
}

// A stall inside a process set fails that set's operations, naming global ranks, and closes the
// set; the global set and the other ranks go on.
TEST_F(StallTest, StallInAProcessSetClosesOnlyThatSet) {
  if (size_ < 3) GTEST_SKIP() << "needs two set members and a rank outside";
  const ProcessSet set = add_process_set({1, 2});
  float x[4] = {};
  AllreduceOptions in_set;
  in_set.name = "set.stall.x";
  in_set.process_set = set;
  if (rank_ == 1) {
    EXPECT_TRUE(FailsWith(allreduce(TensorView(x, DataType::kFloat32, {4}), in_set),
                          StatusCode::kStalled, "missing on rank 2 (ready on 1)"));
  }
  // Meet outside gradsync (a gradsync barrier would itself stall while rank 1 waits), then on the
  // global set: its cycle comes after the set's on every member, so both have closed the set.
  MPI_Barrier(MPI_COMM_WORLD);
  int value = 1;
  ASSERT_TRUE(Succeeds(allreduce(TensorView(&value, DataType::kInt32, {1}))));
  EXPECT_EQ(value, size_);
  if (set.included()) {
    EXPECT_TRUE(ThrowsWith([&] { allreduce(TensorView(x, DataType::kFloat32, {4}), in_set); },
                           StatusCode::kStalled, "failed earlier and takes no more operations"));
  }
  remove_process_set(set);
}

TEST_F(StallTest, RuntimeWorksAgainAfterReinit) {
  int value = 1;
  ASSERT_TRUE(Succeeds(allreduce(TensorView(&value, DataType::kInt32, {1}))));
  EXPECT_EQ(value, size_);
}

TEST_F(StallTest, IdleProcessBarelyUsesTheCpu) {
  const double cpu0 = ProcessCpuSeconds(), wall0 = WallSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double cpu = ProcessCpuSeconds() - cpu0, wall = WallSeconds() - wall0;
  // Spinning would be ~1.0. An idle rank's rounds, a cycle time (1 ms) apart at first, then a
  // sixteenth of its idle time: 1.1-1.6% of a core here at 2 and 4 ranks on 2 cores, where one a
  // millisecond throughout took 7.6-9.9%.
  EXPECT_LT(cpu / wall, 0.05) << cpu << " s of CPU in " << wall << " s idle";
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
