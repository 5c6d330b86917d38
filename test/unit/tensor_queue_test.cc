#include "runtime/tensor_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/host_stream.h"

namespace gradsync {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

std::unique_ptr<TensorEntry> Entry(const std::string& name) {
  auto entry = std::make_unique<TensorEntry>();
  entry->name = name;
  entry->state = std::make_shared<OpState>();
  return entry;
}

std::vector<std::unique_ptr<TensorEntry>> Entries(const std::vector<std::string>& names) {
  std::vector<std::unique_ptr<TensorEntry>> entries;
  for (const auto& name : names) entries.push_back(Entry(name));
  return entries;
}

std::vector<std::string> Names(const std::vector<TensorEntry*>& entries) {
  std::vector<std::string> names;
  for (const auto& entry : entries) names.push_back(entry->name);
  return names;
}

// Generous enough that a loaded CI machine does not turn "returned early" into a flake.
constexpr milliseconds kLongWait{10000};

TEST(TensorQueueTest, DrainReturnsEntriesInPushOrder) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  ASSERT_TRUE(queue.Push(Entry("c")).ok());
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_TRUE(queue.Drain().empty());
  ASSERT_TRUE(queue.Push(Entry("d")).ok());
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"d"}));
}

TEST(TensorQueueTest, NullEntryIsRejected) {
  TensorQueue queue;
  EXPECT_EQ(queue.Push(nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<std::unique_ptr<TensorEntry>> batch;
  batch.push_back(Entry("a"));
  batch.push_back(nullptr);
  EXPECT_EQ(queue.PushAll(std::move(batch)).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(queue.Push(Entry("a")).ok());
}

TEST(TensorQueueTest, DuplicateNameIsRejectedWhileInFlight) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("grad.w")).ok());
  Status status = queue.Push(Entry("grad.w"));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "tensor name 'grad.w' is already in flight; names must be unique until the operation "
            "completes");
  // Draining hands the entry to the background thread, but the name stays in flight.
  EXPECT_EQ(queue.Drain().size(), 1u);
  EXPECT_EQ(queue.Push(Entry("grad.w")).code(), StatusCode::kInvalidArgument);
}

// Stands for a device operation's completion event; these tests never ask it anything.
class NeverAskedEvent : public StreamEvent {
 public:
  bool Query() override { return false; }
  Status Wait(std::chrono::nanoseconds) override { return Status::OK(); }
};

// A name whose operation was launched and ordered on a stream comes back with the next step while
// the device may still run it: the push waits for the completion instead of failing.
TEST(TensorQueueTest, NameOfALaunchedOperationIsAcceptedOnceItCompletes) {
  TensorQueue queue;
  auto first = Entry("grad.w");
  first->state->SetLaunched(std::make_shared<NeverAskedEvent>());
  ASSERT_TRUE(queue.Push(std::move(first)).ok());
  const std::vector<TensorEntry*> running = queue.Drain();
  std::atomic<bool> pushed{false};
  Status second;
  std::thread next_step([&] {
    second = queue.Push(Entry("grad.w"));
    pushed = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(pushed.load());
  queue.Release(running);
  next_step.join();
  EXPECT_TRUE(second.ok()) << second.ToString();
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"grad.w"}));
}

TEST(TensorQueueTest, CloseEndsAWaitForALaunchedName) {
  TensorQueue queue;
  auto first = Entry("grad.w");
  first->state->SetLaunched(std::make_shared<NeverAskedEvent>());
  ASSERT_TRUE(queue.Push(std::move(first)).ok());
  Status second;
  std::thread next_step([&] { second = queue.PushAll(Entries({"grad.b", "grad.w"})); });
  std::this_thread::sleep_for(milliseconds(20));
  queue.Close(Status::Stalled("rank 1 never submitted 'grad.w'"));
  next_step.join();
  EXPECT_EQ(second.code(), StatusCode::kStalled);
}

TEST(TensorQueueTest, NameIsAcceptedAgainAfterRelease) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("grad.w")).ok());
  queue.Release(queue.Drain());
  EXPECT_TRUE(queue.Push(Entry("grad.w")).ok());
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"grad.w"}));
}

TEST(TensorQueueTest, ReleasingAnEntryNotInFlightIsHarmless) {
  TensorQueue queue;
  auto stranger = Entry("never-pushed");
  queue.Release({stranger.get()});
  EXPECT_TRUE(queue.Push(Entry("never-pushed")).ok());
  // Not even when an entry of the same name is in flight, released along with one that is.
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  std::vector<TensorEntry*> drained = queue.Drain();
  auto namesake = Entry("a");
  namesake->name_hash = HashName("a");  // as if pushed: it finds the in-flight "a" by name
  queue.Release({namesake.get(), drained[2]});
  EXPECT_EQ(Names(queue.InFlight()), (std::vector<std::string>{"never-pushed", "a"}));
}

TEST(TensorQueueTest, ReleasingEverythingInFlightAtOnceFreesEveryName) {
  TensorQueue queue;
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(queue.Push(Entry(name)).ok());
  std::vector<TensorEntry*> drained = queue.Drain();
  std::reverse(drained.begin(), drained.end());
  queue.Release(drained);
  EXPECT_TRUE(queue.InFlight().empty());
  queue.Recycle();
  for (const char* name : {"c", "a", "b"}) EXPECT_TRUE(queue.Push(Entry(name)).ok()) << name;
  EXPECT_EQ(queue.InFlight().size(), 3u);
}

// As many entries as are in flight, but not the same ones: only those in flight may be released.
TEST(TensorQueueTest, ReleasingAsManyEntriesAsAreInFlightReleasesOnlyThoseGiven) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  std::vector<TensorEntry*> drained = queue.Drain();
  auto stranger = Entry("stranger");
  queue.Release({drained[0], stranger.get()});
  EXPECT_EQ(Names(queue.InFlight()), (std::vector<std::string>{"b"}));
  queue.Release({drained[0], drained[0], drained[1]});  // a repeated entry counts once
  EXPECT_TRUE(queue.InFlight().empty());
}

TEST(TensorQueueTest, ReleasedEntriesAreReusedCleared) {
  TensorQueue queue;
  auto entry = queue.NewEntry();
  // Every field away from its default, so a field that Clear() forgets fails below.
  float data[60];
  entry->name = "a.rather.long.gradient.name.that.does.not.fit.inline";
  entry->op = OpType::kAlltoall;
  entry->input = TensorView(data, DataType::kInt8, {3, 4, 5}, Device::Cuda(1));
  entry->output = TensorView(data, DataType::kInt64, {2}, Device::Cuda(2));
  entry->reduce_op = ReduceOp::kMax;
  entry->prescale = 2.0;
  entry->postscale = 3.0;
  entry->root = 3;
  entry->splits = {1, 2};
  const HostSegment pieces[1] = {{data, 60}};
  entry->segments = pieces;
  entry->segment_count = 1;
  entry->group = "group";
  entry->group_size = 2;
  entry->process_set = 4;
  entry->allocator = [](const std::vector<int64_t>&, DataType) { return nullptr; };
  entry->ready = std::make_shared<HostEvent>();
  entry->ready_stream = data;
  entry->waits_before = 7;
  entry->state = std::make_shared<OpState>();
  const TensorEntry* address = entry.get();
  const OpState* state = entry->state.get();
  const size_t name_capacity = entry->name.capacity();
  ASSERT_TRUE(queue.Push(std::move(entry)).ok());
  queue.Release(queue.Drain());
  EXPECT_EQ(queue.NewEntry()->name, "") << "an entry is pooled only by Recycle";
  queue.Recycle();

  auto reused = queue.NewEntry();
  const TensorEntry fresh;
  EXPECT_EQ(reused.get(), address);
  EXPECT_TRUE(reused->name.empty());
  EXPECT_GE(reused->name.capacity(), name_capacity);  // kept, so refilling does not allocate
  EXPECT_EQ(reused->op, fresh.op);
  for (const TensorView* view : {&reused->input, &reused->output}) {
    EXPECT_EQ(view->data, nullptr);
    EXPECT_EQ(view->dtype, fresh.input.dtype);
    EXPECT_TRUE(view->shape.empty());
    EXPECT_EQ(view->device, fresh.input.device);
  }
  EXPECT_EQ(reused->reduce_op, fresh.reduce_op);
  EXPECT_EQ(reused->prescale, fresh.prescale);
  EXPECT_EQ(reused->postscale, fresh.postscale);
  EXPECT_EQ(reused->root, fresh.root);
  EXPECT_TRUE(reused->splits.empty());
  EXPECT_EQ(reused->segments, nullptr);
  EXPECT_EQ(reused->segment_count, 0u);
  EXPECT_TRUE(reused->group.empty());
  EXPECT_EQ(reused->group_size, fresh.group_size);
  EXPECT_EQ(reused->process_set, fresh.process_set);
  EXPECT_FALSE(reused->allocator);
  EXPECT_EQ(reused->ready, nullptr);
  EXPECT_EQ(reused->ready_stream, nullptr);
  EXPECT_EQ(reused->waits_before, 0u);
  EXPECT_FALSE(reused->in_flight);
  EXPECT_EQ(reused->state.get(), state);       // kept for OpState::Renew
  EXPECT_NE(queue.NewEntry().get(), address);  // the pool is empty again: a new one
}

TEST(TensorQueueTest, PushAllAcceptsABatchInOrder) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("first")).ok());
  ASSERT_TRUE(queue.PushAll(Entries({"x", "y", "z"})).ok());
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"first", "x", "y", "z"}));
  EXPECT_EQ(queue.Push(Entry("y")).code(), StatusCode::kInvalidArgument);
}

TEST(TensorQueueTest, PushAllIsAtomicWhenOneNameIsInFlight) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  Status status = queue.PushAll(Entries({"a", "b", "c"}));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'b'"), std::string::npos);
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"b"}));
  // Neither "a" nor "c" was left in flight by the rejected batch.
  EXPECT_TRUE(queue.Push(Entry("a")).ok());
  EXPECT_TRUE(queue.Push(Entry("c")).ok());
}

TEST(TensorQueueTest, PushAllRejectsDuplicatesWithinTheBatch) {
  TensorQueue queue;
  Status status = queue.PushAll(Entries({"a", "b", "a"}));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'a'"), std::string::npos);
  EXPECT_TRUE(queue.Drain().empty());
  EXPECT_TRUE(queue.PushAll(Entries({"a", "b"})).ok());
}

TEST(TensorQueueTest, EmptyBatchIsAccepted) {
  TensorQueue queue;
  EXPECT_TRUE(queue.PushAll({}).ok());
  EXPECT_TRUE(queue.Drain().empty());
}

TEST(TensorQueueTest, PushesFailWithTheCloseStatus) {
  TensorQueue queue;
  EXPECT_TRUE(queue.closed_status().ok());
  ASSERT_TRUE(queue.Push(Entry("before")).ok());
  queue.Close(Status::Stalled("rank 3 never submitted 'x'"));
  Status status = queue.Push(Entry("after"));
  EXPECT_EQ(status.code(), StatusCode::kStalled);
  EXPECT_EQ(status.message(), "rank 3 never submitted 'x'");
  EXPECT_EQ(queue.PushAll(Entries({"p", "q"})).code(), StatusCode::kStalled);
  EXPECT_EQ(queue.PushAll({}).code(), StatusCode::kStalled);
  EXPECT_EQ(queue.closed_status().code(), StatusCode::kStalled);
  // Entries accepted before the close are still handed over, so their handles can be failed.
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"before"}));
}

TEST(TensorQueueTest, FirstCloseReasonWins) {
  TensorQueue queue;
  queue.Close(Status::Stalled("first"));
  queue.Close(Status::Shutdown("second"));
  EXPECT_EQ(queue.closed_status().message(), "first");
}

TEST(TensorQueueTest, CloseWithOkStillRejectsPushes) {
  TensorQueue queue;
  queue.Close(Status::OK());
  EXPECT_EQ(queue.Push(Entry("a")).code(), StatusCode::kShutdown);
  EXPECT_FALSE(queue.closed_status().ok());
}

TEST(TensorQueueTest, WaitForWorkReturnsAtOnceWhenWorkIsPending) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  auto start = steady_clock::now();
  queue.WaitForWork(kLongWait);
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
}

// Settling waits only while pushes keep arriving: with none coming, it returns long before its
// limit.
TEST(TensorQueueTest, SettlingStopsWhenNoMorePushesArrive) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  auto start = steady_clock::now();
  queue.WaitForWork(kLongWait, /*settle_for=*/kLongWait);
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
  EXPECT_EQ(queue.Drain().size(), 1u);
}

TEST(TensorQueueTest, WaitForWorkTimesOut) {
  TensorQueue queue;
  auto start = steady_clock::now();
  queue.WaitForWork(milliseconds(30));
  auto waited = steady_clock::now() - start;
  EXPECT_GE(waited, milliseconds(30));
  EXPECT_LT(waited, kLongWait);
}

TEST(TensorQueueTest, APollingWaitSeesAPushAndEndsAtItsMaximum) {
  TensorQueue queue;
  auto start = steady_clock::now();
  queue.WaitForWork(milliseconds(30), milliseconds(0), /*poll_for=*/kLongWait);
  auto waited = steady_clock::now() - start;
  EXPECT_GE(waited, milliseconds(30));
  EXPECT_LT(waited, kLongWait);  // the poll is part of the wait, not added to it
  // A push during the poll ends it; one after it wakes the sleep that follows.
  for (const auto push_after : {milliseconds(1), milliseconds(40)}) {
    std::thread pusher([&] {
      std::this_thread::sleep_for(push_after);
      ASSERT_TRUE(queue.Push(Entry("a")).ok());
    });
    start = steady_clock::now();
    queue.WaitForWork(kLongWait, milliseconds(0), /*poll_for=*/milliseconds(20));
    EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
    pusher.join();
    const std::vector<TensorEntry*> drained = queue.Drain();
    EXPECT_EQ(drained.size(), 1u);
    queue.Release(drained);
  }
}

// A thread in WaitForWork(kLongWait), given time to fall asleep there; sets *returned, if given,
// once the wait returns.
std::thread SleepingWaiter(TensorQueue* queue, std::atomic<bool>* returned = nullptr) {
  std::thread waiter([queue, returned] {
    queue->WaitForWork(kLongWait);
    if (returned != nullptr) *returned = true;
  });
  std::this_thread::sleep_for(milliseconds(50));  // usually lets the waiter fall asleep first
  return waiter;
}

TEST(TensorQueueTest, ASleepingWaiterWakesOnlyOnceEnoughEntriesWait) {
  TensorQueue queue;
  queue.SetWakeAfter(2);
  std::atomic<bool> returned{false};
  std::thread waiter = SleepingWaiter(&queue, &returned);
  auto start = steady_clock::now();
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned.load()) << "woken by the first push";
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  waiter.join();
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
  std::vector<TensorEntry*> drained = queue.Drain();
  EXPECT_EQ(drained.size(), 2u);
  // Back to 1: every push wakes a sleeping waiter again; and 0 means 1.
  queue.Release(drained);
  queue.SetWakeAfter(0);
  std::thread again = SleepingWaiter(&queue);
  start = steady_clock::now();
  ASSERT_TRUE(queue.Push(Entry("c")).ok());
  again.join();
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
}

// A push given `due` says whether it would have woken the waiter and leaves it asleep: the
// pusher does the waiter's work itself, or wakes it.
TEST(TensorQueueTest, APushThatReportsDueLeavesTheWaiterToItsCaller) {
  TensorQueue queue;
  queue.SetWakeAfter(2);
  std::atomic<bool> returned{false};
  std::thread waiter = SleepingWaiter(&queue, &returned);
  bool due = true;
  ASSERT_TRUE(queue.Push(Entry("a"), &due).ok());
  EXPECT_FALSE(due) << "one entry of the two the waiter waits for";
  ASSERT_TRUE(queue.Push(Entry("b"), &due).ok());
  EXPECT_TRUE(due);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned.load()) << "a due push woke the waiter";
  const auto start = steady_clock::now();
  queue.Wake();
  waiter.join();
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
  EXPECT_EQ(queue.Drain().size(), 2u);
}

// The same for a group pushed at once (a grouped allreduce that fills a locked bucket).
TEST(TensorQueueTest, AGroupPushThatReportsDueLeavesTheWaiterToItsCaller) {
  TensorQueue queue;
  queue.SetWakeAfter(3);
  std::atomic<bool> returned{false};
  std::thread waiter = SleepingWaiter(&queue, &returned);
  auto group = [](const char* first, const char* second) {
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(Entry(first));
    entries.push_back(Entry(second));
    return entries;
  };
  bool due = true;
  ASSERT_TRUE(queue.PushAll(group("a", "b"), &due).ok());
  EXPECT_FALSE(due) << "two entries of the three the waiter waits for";
  ASSERT_TRUE(queue.PushAll(group("c", "d"), &due).ok());
  EXPECT_TRUE(due);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned.load()) << "a due push woke the waiter";
  queue.Wake();
  waiter.join();
  EXPECT_EQ(queue.Drain().size(), 4u);
}

// A join (or any collective a locked plan cannot hold) wakes the waiter at once.
TEST(TensorQueueTest, AJoinWakesTheWaiterWhateverTheThreshold) {
  TensorQueue queue;
  queue.SetWakeAfter(100);
  std::thread waiter = SleepingWaiter(&queue);
  auto start = steady_clock::now();
  auto join = Entry("join");
  join->op = OpType::kJoin;
  ASSERT_TRUE(queue.Push(std::move(join)).ok());
  waiter.join();
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
}

TEST(TensorQueueTest, WaitForWorkWakesOnPushFromAnotherThread) {
  TensorQueue queue;
  std::atomic<bool> returned{false};
  std::thread waiter = SleepingWaiter(&queue, &returned);
  auto start = steady_clock::now();
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  waiter.join();
  EXPECT_TRUE(returned);
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
  EXPECT_EQ(queue.Drain().size(), 1u);
}

TEST(TensorQueueTest, EveryPushAfterADrainWakesTheWaiterAgain) {
  TensorQueue queue;
  constexpr int kRounds = 50;
  std::thread waiter([&] {
    for (int i = 0; i < kRounds; ++i) {
      std::vector<TensorEntry*> got;
      while (got.empty()) {
        queue.WaitForWork(kLongWait);
        got = queue.Drain();
      }
      queue.Release(got);
      queue.Recycle();
    }
  });
  auto start = steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    while (!queue.Push(Entry("grad")).ok()) std::this_thread::yield();
  }
  waiter.join();
  // Fifty lost wake-ups would each cost the full long wait.
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
}

TEST(TensorQueueTest, WakeInterruptsASleepingWaiter) {
  TensorQueue queue;
  std::thread waiter([&] { queue.WaitForWork(kLongWait); });
  std::this_thread::sleep_for(milliseconds(50));
  auto start = steady_clock::now();
  queue.Wake();
  waiter.join();
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
}

TEST(TensorQueueTest, WakeBeforeWaitIsRememberedOnceThenConsumed) {
  TensorQueue queue;
  queue.Wake();
  auto start = steady_clock::now();
  queue.WaitForWork(kLongWait);
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
  // The request was consumed: the next wait sleeps until its timeout.
  start = steady_clock::now();
  queue.WaitForWork(milliseconds(30));
  EXPECT_GE(steady_clock::now() - start, milliseconds(30));
}

TEST(TensorQueueTest, CloseWakesASleepingWaiterAndLaterWaitsReturnAtOnce) {
  TensorQueue queue;
  std::thread waiter([&] { queue.WaitForWork(kLongWait); });
  std::this_thread::sleep_for(milliseconds(50));
  auto start = steady_clock::now();
  queue.Close(Status::Shutdown("bye"));
  waiter.join();
  queue.WaitForWork(kLongWait);
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
}

TEST(TensorQueueTest, HasPendingSeesPushesSinceTheLastDrain) {
  TensorQueue queue;
  EXPECT_FALSE(queue.HasPending());
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  EXPECT_TRUE(queue.HasPending());
  queue.Drain();
  EXPECT_FALSE(queue.HasPending());
}

// The pause that spaces a streaming caller's cycles: pushes must not end it, or every tensor of a
// backward pass would start a cycle of its own again.
TEST(TensorQueueTest, PauseLastsUntilItsDeadlineWhateverIsPushed) {
  TensorQueue queue;
  std::thread pusher([&] {
    for (int i = 0; i < 5; ++i) {
      EXPECT_TRUE(queue.Push(Entry("p" + std::to_string(i))).ok());
      std::this_thread::sleep_for(milliseconds(5));
    }
  });
  const auto start = steady_clock::now();
  queue.PauseUntil(start + milliseconds(60));
  EXPECT_GE(steady_clock::now() - start, milliseconds(60));
  pusher.join();
  EXPECT_EQ(queue.Drain().size(), 5u);
}

TEST(TensorQueueTest, WakeAndCloseEndAPause) {
  TensorQueue queue;
  for (bool close : {false, true}) {
    std::thread pauser([&] { queue.PauseUntil(steady_clock::now() + kLongWait); });
    std::this_thread::sleep_for(milliseconds(50));
    const auto start = steady_clock::now();
    if (close) {
      queue.Close(Status::Shutdown("bye"));
    } else {
      queue.Wake();
    }
    pauser.join();
    EXPECT_LT(steady_clock::now() - start, kLongWait / 2) << (close ? "close" : "wake");
    queue.WaitForWork(milliseconds(1));  // consumes the wake-up request
  }
}

// A caller about to block on a result ends the pause, even one that has not begun yet; the pause
// after that lasts again.
TEST(TensorQueueTest, EndPauseEndsThisPauseOrTheNextOnce) {
  TensorQueue queue;
  std::thread pauser([&] { queue.PauseUntil(steady_clock::now() + kLongWait); });
  std::this_thread::sleep_for(milliseconds(50));
  auto start = steady_clock::now();
  queue.EndPause();
  pauser.join();
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);

  queue.EndPause();
  start = steady_clock::now();
  queue.PauseUntil(start + kLongWait);
  EXPECT_LT(steady_clock::now() - start, kLongWait / 2);
  start = steady_clock::now();
  queue.PauseUntil(start + milliseconds(30));
  EXPECT_GE(steady_clock::now() - start, milliseconds(30));
}

TEST(TensorQueueTest, ConcurrentPushersAreAllAccepted) {
  TensorQueue queue;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  std::vector<std::thread> pushers;
  for (int t = 0; t < kThreads; ++t) {
    pushers.emplace_back([&queue, t] {
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE(queue.Push(Entry("t" + std::to_string(t) + "." + std::to_string(i))).ok());
      }
    });
  }
  size_t drained = 0;
  const auto deadline = steady_clock::now() + kLongWait;
  while (drained < kThreads * kPerThread && steady_clock::now() < deadline) {
    queue.WaitForWork(milliseconds(10));
    drained += queue.Drain().size();
  }
  for (auto& pusher : pushers) pusher.join();
  EXPECT_EQ(drained, static_cast<size_t>(kThreads * kPerThread));
}

// A caller pushing while the completing thread releases and recycles the entries before it, as a
// locked step's buckets do: every push is accepted and every entry completed.
TEST(TensorQueueTest, PushesWhileEarlierEntriesAreReleasedAreAllAccepted) {
  TensorQueue queue;
  constexpr int kSteps = 50;
  constexpr int kPerStep = 64;
  std::atomic<int> completed{0};
  std::thread completer([&] {
    const auto deadline = steady_clock::now() + kLongWait;
    while (completed < kSteps * kPerStep && steady_clock::now() < deadline) {
      queue.WaitForWork(milliseconds(1));
      std::vector<TensorEntry*> drained = queue.Drain();
      queue.Release(drained);
      queue.Recycle();
      completed += static_cast<int>(drained.size());
    }
  });
  for (int step = 0; step < kSteps; ++step) {
    for (int t = 0; t < kPerStep; ++t) {
      std::unique_ptr<TensorEntry> entry = queue.NewEntry();
      entry->name = std::to_string(step) + "." + std::to_string(t);
      entry->state = std::make_shared<OpState>();
      EXPECT_TRUE(queue.Push(std::move(entry)).ok());
    }
  }
  completer.join();
  EXPECT_EQ(completed, kSteps * kPerStep);
}

}  // namespace
}  // namespace gradsync
