// Stream ordering after several handles: one wait for each distinct completion. Without CUDA
// streams the orders are host waits (OrderStreamAfter on an event that is not CUDA's), which is
// what these events count; a CUDA stream gets one cudaStreamWaitEvent where they count one wait.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bindings/runtime.h"
#include "gradsync/gradsync.h"
#include "runtime/op_state.h"

namespace gradsync {
namespace {

// A completed bucket's event, failed or not, that counts the waits on it.
class CountedEvent : public StreamEvent {
 public:
  explicit CountedEvent(Status status = Status::OK()) : status_(std::move(status)) {}
  bool Query() override { return true; }
  Status Wait(std::chrono::nanoseconds) override {
    waits_.fetch_add(1);
    return status_;
  }
  int waits() const { return waits_.load(); }

 private:
  Status status_;
  std::atomic<int> waits_{0};
};

Handle LaunchedOn(const std::shared_ptr<StreamEvent>& event) {
  auto state = std::make_shared<OpState>();
  state->SetLaunched(event);
  return MakeHandle(state);
}

// A stream that is never used as one: no CUDA event is among these.
void* const kStream = reinterpret_cast<void*>(0x10);

// Two buckets of three members each, listed as a batch lists them (a bucket's members need not be
// next to each other): each bucket's completion is waited once.
TEST(HandleTest, AStreamIsOrderedOnceForEachDistinctCompletion) {
  auto first = std::make_shared<CountedEvent>();
  auto second = std::make_shared<CountedEvent>();
  const std::vector<Handle> handles = {LaunchedOn(first), LaunchedOn(first),  LaunchedOn(second),
                                       LaunchedOn(first), LaunchedOn(second), LaunchedOn(second)};
  synchronize_stream(handles, kStream);
  EXPECT_EQ(first->waits(), 1);
  EXPECT_EQ(second->waits(), 1);
  // Each call stands alone: the next step's handles are ordered again.
  synchronize_stream(handles, kStream);
  EXPECT_EQ(first->waits(), 2);
  EXPECT_EQ(second->waits(), 2);
  synchronize_stream({}, kStream);  // nothing to order
}

// A failed bucket is reported, and the stream is still ordered after the buckets behind it.
TEST(HandleTest, AFailureIsThrownAfterEveryOtherCompletionIsOrdered) {
  auto failed = std::make_shared<CountedEvent>(Status::Timeout("the plane was aborted"));
  auto fine = std::make_shared<CountedEvent>();
  try {
    synchronize_stream({LaunchedOn(failed), LaunchedOn(failed), LaunchedOn(fine)}, kStream);
    FAIL() << "the failure was not thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("the plane was aborted"), std::string::npos);
  }
  EXPECT_EQ(failed->waits(), 1);
  EXPECT_EQ(fine->waits(), 1);
}

// One handle: the member function, with its own message for an empty handle.
TEST(HandleTest, OneHandleIsOrderedAsInAList) {
  auto event = std::make_shared<CountedEvent>();
  LaunchedOn(event).synchronize_stream(kStream);
  EXPECT_EQ(event->waits(), 1);
  try {
    Handle().synchronize_stream(kStream);
    FAIL() << "an empty handle was ordered";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace gradsync
