// NodeLockChannel at 1, 2 and 4 ranks, through node shared memory and through MPI: the AND of many
// exchanges in a row (so each shared-memory buffer is reused), an exchange that no rank completes
// before the last rank starts it, and nudges. locked_schedule_test runs the channel a process set
// gets, through every lock, unlock and deviation.
#include "coordinator/node_lock_channel.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

constexpr auto kPollLimit = std::chrono::seconds(30);

// Polls the exchange in flight until it completes (bounded); its AND in *words.
::testing::AssertionResult Completes(LockChannel& channel, std::vector<uint64_t>* words) {
  const auto limit = std::chrono::steady_clock::now() + kPollLimit;
  for (;;) {
    bool done = false;
    const Status tested = channel.TestAnd(&done, words);
    if (!tested.ok()) return ::testing::AssertionFailure() << tested.ToString();
    if (done) return ::testing::AssertionSuccess();
    if (std::chrono::steady_clock::now() > limit) {
      return ::testing::AssertionFailure() << "the exchange did not complete";
    }
    // Leaves the core to ranks that share it, as the locked schedule's poll does.
    std::this_thread::yield();
  }
}

// The words rank `rank` sends in exchange `n`: every bit set but one per rank and word.
std::vector<uint64_t> WordsOf(int rank, uint64_t n, size_t count) {
  std::vector<uint64_t> words(count);
  for (size_t w = 0; w < count; ++w) {
    words[w] = ~(uint64_t{1} << ((static_cast<uint64_t>(rank) * 7 + n * 3 + w * 11) % 64));
  }
  return words;
}

class LockChannelTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    channel_ = std::make_unique<NodeLockChannel>(MPI_COMM_WORLD, /*shared_memory=*/GetParam());
    ASSERT_TRUE(channel_->Open().ok());
    // Every rank of these tests runs on one node: past one rank, shared memory when allowed.
    EXPECT_EQ(channel_->on_shared_memory(), GetParam() && size_ > 1);
  }

  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<NodeLockChannel> channel_;
};

TEST_P(LockChannelTest, AndOfManyExchangesInARow) {
  for (uint64_t n = 0; n < 500; ++n) {
    if (n == 250) {
      // A set that locks again opens its channel again: the same path, numbering goes on.
      ASSERT_TRUE(channel_->Open().ok());
      ASSERT_EQ(channel_->on_shared_memory(), GetParam() && size_ > 1);
    }
    const size_t count = 1 + n % NodeLockChannel::kMaxWords;
    ASSERT_TRUE(channel_->StartAnd(WordsOf(rank_, n, count)).ok());
    std::vector<uint64_t> words;
    ASSERT_TRUE(Completes(*channel_, &words)) << "exchange " << n;
    std::vector<uint64_t> expected(count, ~uint64_t{0});
    for (int r = 0; r < size_; ++r) {
      const std::vector<uint64_t> theirs = WordsOf(r, n, count);
      for (size_t w = 0; w < count; ++w) expected[w] &= theirs[w];
    }
    ASSERT_EQ(words, expected) << "exchange " << n;
  }
}

TEST_P(LockChannelTest, NoRankCompletesBeforeTheLastStarts) {
  const int last = size_ - 1;
  const std::vector<uint64_t> mine = {~uint64_t{0}, static_cast<uint64_t>(rank_)};
  if (rank_ != last) {
    ASSERT_TRUE(channel_->StartAnd(mine).ok());
    bool done = true;
    std::vector<uint64_t> words;
    ASSERT_TRUE(channel_->TestAnd(&done, &words).ok());
    EXPECT_FALSE(done) << "completed before rank " << last << " started";
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the last rank starts only after the others have looked
  if (rank_ == last) {
    ASSERT_TRUE(channel_->StartAnd(mine).ok());
  }
  std::vector<uint64_t> words;
  ASSERT_TRUE(Completes(*channel_, &words));
  uint64_t expected = ~uint64_t{0};
  for (int r = 0; r < size_; ++r) expected &= static_cast<uint64_t>(r);
  EXPECT_EQ(words, (std::vector<uint64_t>{~uint64_t{0}, expected}));
}

TEST_P(LockChannelTest, NudgesReachTheOtherRanks) {
  if (size_ == 1) GTEST_SKIP() << "no other rank to nudge";
  if (rank_ == 1) {
    ASSERT_TRUE(channel_->Nudge(5).ok());
    ASSERT_TRUE(channel_->Nudge(3).ok());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ != 1) {
    // Through MPI the nudge may still be on its way after the barrier.
    const auto limit = std::chrono::steady_clock::now() + kPollLimit;
    uint64_t highest = 0;
    while (highest == 0 && std::chrono::steady_clock::now() < limit) {
      ASSERT_TRUE(channel_->TakeNudges(&highest).ok());
    }
    EXPECT_EQ(highest, 5u);
    ASSERT_TRUE(channel_->TakeNudges(&highest).ok());
    EXPECT_LE(highest, 5u);  // nothing higher came; through MPI the 3 may come now
  }
  uint64_t own = 0;
  if (rank_ == 1) {
    ASSERT_TRUE(channel_->TakeNudges(&own).ok());
    EXPECT_EQ(own, 0u) << "a rank's own nudge is not reported to it";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_P(LockChannelTest, TheRanksNotAtAnExchangeAreNamed) {
  if (size_ == 1) GTEST_SKIP() << "no other rank to wait for";
  const int last = size_ - 1;
  const std::vector<uint64_t> mine = {~uint64_t{0}};
  if (rank_ != last) {
    ASSERT_TRUE(channel_->StartAnd(mine).ok());
    ASSERT_TRUE(channel_->Nudge(1).ok());  // as a rank waiting on exchange 1 does
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ != last) {
    // Through MPI the others' nudges may still be on their way after the barrier.
    const auto limit = std::chrono::steady_clock::now() + kPollLimit;
    uint64_t highest = 0;
    while (channel_->NotArrived(1).size() > 1 && std::chrono::steady_clock::now() < limit) {
      ASSERT_TRUE(channel_->TakeNudges(&highest).ok());
    }
    EXPECT_EQ(channel_->NotArrived(1), std::vector<int>{last});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == last) {
    ASSERT_TRUE(channel_->StartAnd(mine).ok());
  }
  std::vector<uint64_t> words;
  ASSERT_TRUE(Completes(*channel_, &words));
  if (rank_ != last && GetParam()) {
    EXPECT_TRUE(channel_->NotArrived(1).empty());  // every rank has published it
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

INSTANTIATE_TEST_SUITE_P(Transports, LockChannelTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "SharedMemory" : "Mpi"; });

}  // namespace
}  // namespace testing
}  // namespace gradsync
