#include "runtime/cpu_relax.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace gradsync {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(LockSpinningFirstTest, TakesAFreeMutex) {
  std::mutex mu;
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  LockSpinningFirst(&lock, microseconds(10));
  EXPECT_TRUE(lock.owns_lock());
  EXPECT_FALSE(mu.try_lock());
}

// Both ways in (a holder that lets go within the spin, and one that keeps the mutex past it)
// must exclude the others: every increment is kept.
TEST(LockSpinningFirstTest, ExcludesOtherHoldersWithAndWithoutASpin) {
  for (const auto spin : {microseconds(0), microseconds(10), microseconds(1000)}) {
    std::mutex mu;
    int64_t counter = 0;
    constexpr int kThreads = 4;
    constexpr int kPerThread = 5000;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < kPerThread; ++i) {
          std::unique_lock<std::mutex> lock(mu, std::defer_lock);
          LockSpinningFirst(&lock, spin);
          ++counter;
        }
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(counter, kThreads * kPerThread) << "spin " << spin.count() << " us";
  }
}

// A holder that keeps the mutex far longer than the spin: the waiter blocks instead, and gets the
// mutex only once the holder has let it go.
TEST(LockSpinningFirstTest, WaitsOutAHolderThatKeepsItPastTheSpin) {
  std::mutex mu;
  std::atomic<bool> held{false};
  std::atomic<bool> released{false};
  std::thread holder([&] {
    std::lock_guard<std::mutex> lock(mu);
    held = true;
    std::this_thread::sleep_for(milliseconds(50));
    released = true;
  });
  while (!held) std::this_thread::yield();
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  LockSpinningFirst(&lock, microseconds(10));
  EXPECT_TRUE(lock.owns_lock());
  EXPECT_TRUE(released);
  lock.unlock();
  holder.join();
}

}  // namespace
}  // namespace gradsync
