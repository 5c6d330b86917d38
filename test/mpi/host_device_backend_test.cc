// The host device backend's own bookkeeping, built into device_plane_test: the device memory it
// stands in for is counted while held, so that the soak can leave it out of its host-memory
// bounds as a GPU's memory would be.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "ops/device/host_device_backend.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

TEST(HostDeviceBackendTest, DeviceMemoryCountsAsHeldUntilTheStreamFreesIt) {
  std::unique_ptr<HostDeviceBackend> backend;
  ASSERT_TRUE(HostDeviceBackend::Create(MPI_COMM_WORLD, &backend).ok());
  const int64_t before = HostDeviceBackend::DeviceBytesHeld();
  void* first = nullptr;
  void* second = nullptr;
  ASSERT_TRUE(backend->Allocate(1000, &first).ok());
  ASSERT_TRUE(backend->Allocate(1 << 20, &second).ok());
  const int64_t both = HostDeviceBackend::DeviceBytesHeld();
  EXPECT_GE(both - before, 1000 + (1 << 20));

  backend->FreeAfterWork(first);
  ASSERT_TRUE(backend->stream()->Record()->Wait(kWaitLimit).ok());
  EXPECT_GE(both - HostDeviceBackend::DeviceBytesHeld(), 1000);
  EXPECT_GE(HostDeviceBackend::DeviceBytesHeld() - before, 1 << 20);

  backend->FreeAfterWork(second);
  ASSERT_TRUE(backend->stream()->Record()->Wait(kWaitLimit).ok());
  EXPECT_EQ(HostDeviceBackend::DeviceBytesHeld(), before);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
