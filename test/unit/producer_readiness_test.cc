#include "ops/device/producer_readiness.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ops/device/device_events.h"
#include "runtime/host_stream.h"
#include "test/host_stream_readiness.h"

namespace gradsync {
namespace {

class ProducerReadinessTest : public ::testing::Test {
 protected:
  void SetUp() override { SetReadinessRecorderForTesting(&testing::RecordOnHostStream); }
  void TearDown() override { SetReadinessRecorderForTesting(nullptr); }
};

// One event per stream and device for a batch, shared by its entries; entries without a stream
// are left alone.
TEST_F(ProducerReadinessTest, OneEventPerStreamAndDevice) {
  HostStream first;
  HostStream second;
  std::vector<TensorEntry> entries(5);
  void* streams[] = {&first, &second, &first, nullptr, &first};
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i].input.device = Device::Cuda(i == 4 ? 1 : 0);
    entries[i].ready_stream = streams[i];
  }
  std::vector<TensorEntry*> batch;
  for (TensorEntry& entry : entries) batch.push_back(&entry);
  ASSERT_TRUE(RecordProducerReadiness(batch).ok());
  for (TensorEntry& entry : entries) EXPECT_EQ(entry.ready_stream, nullptr);
  EXPECT_EQ(entries[0].ready, entries[2].ready);
  EXPECT_NE(entries[0].ready, entries[1].ready);
  EXPECT_NE(entries[0].ready, entries[4].ready) << "another device";
  EXPECT_EQ(entries[3].ready, nullptr);
}

// A locked enqueue leaves its record to the cycle that takes the entry, which may run on another
// thread; the calling thread's own default stream cannot be recorded there.
TEST_F(ProducerReadinessTest, OnlyTheCallersOwnStreamIsRecordedAtEveryEnqueue) {
  HostStream producer;
  EXPECT_TRUE(RecordAtEnqueue(&producer, /*deferrable=*/false));
  EXPECT_FALSE(RecordAtEnqueue(&producer, /*deferrable=*/true));
  EXPECT_TRUE(RecordAtEnqueue(PerThreadStreamHandle(), /*deferrable=*/true));
  EXPECT_TRUE(RecordAtEnqueue(PerThreadStreamHandle(), /*deferrable=*/false));
}

}  // namespace
}  // namespace gradsync
