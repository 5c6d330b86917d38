// The tensor queue's side of the background thread: waiting for work (settling, polling,
// sleeping until enough entries wait), waking, and pausing.
#include "runtime/tensor_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "test/unit/tensor_queue_samples.h"

namespace gradsync {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

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

// A caller's locked cycle drains the queue on the caller's thread: a push that woke the waiter
// may be drained before the waiter looks. The waiter sleeps again, and the next push must wake it
// (its flag cleared by the first push, it slept until its limit). Repeated, since the waiter wins
// the race in some rounds.
TEST(TensorQueueTest, APushDrainedBeforeTheWaiterLooksLeavesTheNextToWakeIt) {
  for (int round = 0; round < 20; ++round) {
    TensorQueue queue;
    std::atomic<bool> returned{false};
    std::thread waiter = SleepingWaiter(&queue, &returned);
    ASSERT_TRUE(queue.Push(Entry("drained")).ok());
    std::vector<TensorEntry*> drained = queue.Drain();
    queue.Release(drained);
    std::this_thread::sleep_for(milliseconds(5));
    const auto start = steady_clock::now();
    ASSERT_TRUE(queue.Push(Entry("next")).ok());
    waiter.join();
    EXPECT_LT(steady_clock::now() - start, kLongWait / 2) << "round " << round;
  }
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

}  // namespace
}  // namespace gradsync
