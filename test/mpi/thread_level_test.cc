// An application that initialized MPI with MPI_THREAD_SERIALIZED (the run's
// GRADSYNC_TEST_MPI_THREAD_LEVEL): gradsync makes its MPI calls from one thread at a time, so no
// caller thread reduces a batch's bucket, and the MPI backend for device tensors, whose stream
// thread calls MPI beside the loop's, is refused on every rank instead of racing.
#include <memory>
#include <vector>

#include "test/mpi/device_loop_fixture.h"

namespace gradsync {
namespace testing {
namespace {

class ThreadLevelTest : public DeviceLoopTest {
 protected:
  void SetUp() override {
    DeviceLoopTest::SetUp();
    int provided = MPI_THREAD_MULTIPLE;
    MPI_Query_thread(&provided);
    ASSERT_EQ(provided, MPI_THREAD_SERIALIZED) << "run with GRADSYNC_TEST_MPI_THREAD_LEVEL";
  }
};

TEST_F(ThreadLevelTest, BatchesAreReducedWithoutCallerLanes) {
  HostTensor a(DataType::kFloat32, {17});
  AllreduceBatchOptions options;
  options.names = {"serialized.a"};
  AllreduceBatch batch({a.view()}, options);
  for (int step = 0; step < 4; ++step) {
    for (int64_t i = 0; i < a.size(); ++i) a.Set(i, rank_ + step);
    batch.start(0, a.view().data);
    batch.wait();
    const double want = size_ * step + size_ * (size_ - 1) / 2.0;
    for (int64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.Get(i), want) << "step " << step;
  }
  EXPECT_EQ(batch.caller_reductions(), 0u);
}

TEST_F(ThreadLevelTest, DeviceTensorsThroughMpiAreRefusedOnEveryRank) {
  HostTensor on_device(DataType::kFloat32, {4});
  EXPECT_TRUE(FailsWith(allreduce(OnDevice(&on_device)), StatusCode::kUnsupported,
                        "needs MPI_THREAD_MULTIPLE"));
  // Host tensors go on as before.
  HostTensor on_host(DataType::kFloat32, {4});
  for (int64_t i = 0; i < 4; ++i) on_host.Set(i, 1);
  ASSERT_TRUE(Succeeds(allreduce(on_host.view())));
  EXPECT_EQ(on_host.Get(3), size_);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
