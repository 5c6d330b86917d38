#include "runtime/op_state.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace gradsync {
namespace {

using std::chrono::milliseconds;

void Complete(OpState* state, const Status& status) {
  state->RunCallback(status);
  state->Record(status);
  OpState::AnnounceCompletions();
}

TEST(OpStateTest, PendingUntilRecorded) {
  OpState state;
  EXPECT_FALSE(state.done());
  EXPECT_TRUE(state.status().ok());
  Status status;
  EXPECT_FALSE(state.WaitFor(milliseconds(1), &status));
  Complete(&state, Status::Mismatch("shapes differ"));
  EXPECT_TRUE(state.done());
  EXPECT_EQ(state.status().code(), StatusCode::kMismatch);
  ASSERT_TRUE(state.WaitFor(milliseconds(0), &status));
  EXPECT_EQ(status.message(), "shapes differ");
  EXPECT_EQ(state.Wait().code(), StatusCode::kMismatch);
}

TEST(OpStateTest, ASleepingWaiterWakesWithTheStatus) {
  OpState state;
  Status seen;
  std::thread waiter([&] { seen = state.Wait(); });
  std::this_thread::sleep_for(milliseconds(20));  // let it fall asleep
  Complete(&state, Status::Stalled("rank 1 never sent it"));
  waiter.join();
  EXPECT_EQ(seen.code(), StatusCode::kStalled);
}

// A device operation's waiter polls before it sleeps: completed while it polls or after it has
// gone to sleep, it returns with the status either way, and WaitFor still keeps its timeout.
TEST(OpStateTest, ADeviceOperationsWaiterPollsThenSleeps) {
  for (const auto complete_after :
       {std::chrono::microseconds(10), std::chrono::microseconds(20000)}) {
    OpState state;
    state.on_device = true;
    Status seen;
    std::thread waiter([&] { seen = state.Wait(); });
    std::this_thread::sleep_for(complete_after);
    Complete(&state, Status::Timeout("plane aborted"));
    waiter.join();
    EXPECT_EQ(seen.code(), StatusCode::kTimeout);
  }
  OpState pending;
  pending.on_device = true;
  Status status;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(pending.WaitFor(std::chrono::microseconds(30), &status));
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(50));
  EXPECT_FALSE(pending.WaitFor(milliseconds(5), &status));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(5));
  // The longest timeout there is: a wait that ends only with the operation.
  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(10));
    Complete(&pending, Status::OK());
  });
  EXPECT_TRUE(pending.WaitFor(std::chrono::nanoseconds::max(), &status));
  completer.join();
}

TEST(OpStateTest, RenewForgetsThatTheOperationWasOnADevice) {
  std::shared_ptr<OpState> state;
  OpState::Renew(&state, nullptr);
  state->on_device = true;
  Complete(state.get(), Status::OK());
  OpState* reused = state.get();
  OpState::Renew(&state, nullptr);
  ASSERT_EQ(state.get(), reused);
  EXPECT_FALSE(state->on_device);
}

TEST(OpStateTest, TheCallbackReturnsBeforeTheOperationIsDone) {
  std::atomic<bool> done_inside{true};
  OpState* self = nullptr;
  OpState state([&](const Status&) { done_inside = self->done(); });
  self = &state;
  Complete(&state, Status::OK());
  EXPECT_FALSE(done_inside.load());
  EXPECT_TRUE(state.done());
}

// Waiters of different operations share one wake-up; each must wake for its own completion, in
// whatever order the operations complete, and a batch must wake every waiter it completes.
TEST(OpStateTest, WaitersOfManyOperationsEachWakeForTheirOwn) {
  constexpr int kOps = 16;
  std::vector<std::unique_ptr<OpState>> states;
  for (int i = 0; i < kOps; ++i) states.push_back(std::make_unique<OpState>());
  std::vector<int> codes(kOps, -1);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kOps; ++i) {
    waiters.emplace_back([&, i] {
      Status status;
      // Half wait without a limit, half with one long enough never to expire.
      if (i % 2 == 0) {
        status = states[i]->Wait();
      } else {
        EXPECT_TRUE(states[i]->WaitFor(std::chrono::seconds(60), &status));
      }
      codes[i] = static_cast<int>(status.code());
    });
  }
  std::this_thread::sleep_for(milliseconds(20));
  // Two batches, completed back to front, each announced once.
  for (int i = kOps - 1; i >= kOps / 2; --i) states[i]->Record(Status::Internal("first batch"));
  OpState::AnnounceCompletions();
  for (int i = kOps / 2 - 1; i >= 0; --i) states[i]->Record(Status::OK());
  OpState::AnnounceCompletions();
  for (std::thread& t : waiters) t.join();
  for (int i = 0; i < kOps; ++i) {
    const StatusCode expected = i >= kOps / 2 ? StatusCode::kInternal : StatusCode::kOk;
    EXPECT_EQ(codes[i], static_cast<int>(expected)) << i;
  }
}

// Once no handle holds a completed operation, its object comes back pending, with nothing of the
// old operation left; while a handle still holds it, the handle keeps its result.
TEST(OpStateTest, RenewReusesOnlyAnUnheldState) {
  std::shared_ptr<OpState> state;
  OpState::Renew(&state, nullptr);
  ASSERT_NE(state, nullptr);
  int calls = 0;
  OpState::Renew(&state, [&](const Status&) { ++calls; });
  state->output_shape = {3};
  state->received_splits = {1, 2};
  state->result = 7;
  Complete(state.get(), Status::Mismatch("old"));
  EXPECT_EQ(calls, 1);

  std::shared_ptr<OpState> handle = state;
  const OpState* held = state.get();
  OpState::Renew(&state, nullptr);
  EXPECT_NE(state.get(), held);
  EXPECT_TRUE(handle->done());
  EXPECT_EQ(handle->status().message(), "old");
  EXPECT_EQ(handle->result, 7);

  handle = state;
  handle.reset();
  const OpState* unheld = state.get();
  OpState::Renew(&state, [&](const Status&) { calls += 10; });
  EXPECT_EQ(state.get(), unheld);
  EXPECT_FALSE(state->done());
  EXPECT_TRUE(state->status().ok());
  EXPECT_TRUE(state->output_shape.empty());
  EXPECT_TRUE(state->received_splits.empty());
  EXPECT_EQ(state->result, 0);
  Complete(state.get(), Status::OK());
  EXPECT_EQ(calls, 11);
  EXPECT_TRUE(state->Wait().ok());
}

// An event standing in for a launched bucket's; never asked about here.
class LaunchedEvent : public StreamEvent {
 public:
  bool Query() override { return false; }
  Status Wait(std::chrono::nanoseconds) override { return Status::OK(); }
};

// A waiter for the launch gets the event whether it is launched while the waiter polls (a device
// operation's waiter does) or after it has gone to sleep; a host operation's waiter sleeps at
// once, and the announcement of the launch must wake it (its limit is far beyond the test's).
TEST(OpStateTest, WaitLaunchedWakesForTheLaunchPolledOrAsleep) {
  for (const bool on_device : {true, false}) {
    for (const auto launch_after :
         {std::chrono::microseconds(10), std::chrono::microseconds(20000)}) {
      OpState state;
      state.on_device = on_device;
      auto event = std::make_shared<LaunchedEvent>();
      std::shared_ptr<StreamEvent> seen;
      bool timed_out = true;
      const auto start = std::chrono::steady_clock::now();
      std::thread waiter([&] { seen = state.WaitLaunched(std::chrono::hours(1), &timed_out); });
      std::this_thread::sleep_for(launch_after);
      state.SetLaunched(event);
      OpState::AnnounceLaunches();
      waiter.join();
      EXPECT_EQ(seen, event) << on_device;
      EXPECT_FALSE(timed_out);
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
    }
  }
}

// Completed without a launch (it ran on the host or failed first): no event and no timeout. Not
// launched within the limit: no event, timed out.
TEST(OpStateTest, WaitLaunchedEndsWithTheOperationOrItsLimit) {
  OpState failed;
  failed.on_device = true;
  bool timed_out = true;
  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    Complete(&failed, Status::Shutdown("the plane was aborted"));
  });
  EXPECT_EQ(failed.WaitLaunched(std::chrono::hours(1), &timed_out), nullptr);
  EXPECT_FALSE(timed_out);
  completer.join();

  OpState pending;
  pending.on_device = true;
  EXPECT_EQ(pending.WaitLaunched(milliseconds(5), &timed_out), nullptr);
  EXPECT_TRUE(timed_out);
  EXPECT_FALSE(pending.launched());
}

TEST(OpStateTest, RenewForgetsTheLaunch) {
  std::shared_ptr<OpState> state;
  OpState::Renew(&state, nullptr);
  state->SetLaunched(std::make_shared<LaunchedEvent>());
  EXPECT_TRUE(state->launched());
  Complete(state.get(), Status::OK());
  OpState::Renew(&state, nullptr);
  EXPECT_FALSE(state->launched());
  bool timed_out = false;
  EXPECT_EQ(state->WaitLaunched(std::chrono::microseconds(1), &timed_out), nullptr);
  EXPECT_TRUE(timed_out);
}

TEST(OpStateTest, LaunchingTwiceAborts) {
  OpState state;
  state.SetLaunched(std::make_shared<LaunchedEvent>());
  EXPECT_DEATH(state.SetLaunched(std::make_shared<LaunchedEvent>()), "launched twice");
}

TEST(OpStateTest, RecordingTwiceAborts) {
  OpState state;
  state.Record(Status::OK());
  EXPECT_DEATH(state.Record(Status::OK()), "completed twice");
}

}  // namespace
}  // namespace gradsync
