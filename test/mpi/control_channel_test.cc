// MpiControlChannel at 1, 2 and 4 ranks: its rounds' results, and a round that waits long for a
// rank, which the waiting ranks report instead of waiting in silence, and give up on past the stall
// shutdown time. negotiator_test and the
// collective tests run the channel through negotiation.
#include "coordinator/mpi_control_channel.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "runtime/mpi_context.h"

namespace gradsync {
namespace testing {
namespace {

const char kWaited[] = "has waited";

int Rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int Size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// A communicator of the test's own, freed with it unless a round on it was abandoned.
class OwnComm {
 public:
  OwnComm() { MPI_Comm_dup(MPI_COMM_WORLD, &comm_); }
  ~OwnComm() { FreeCommunicator(&comm_); }
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

TEST(MpiControlChannelTest, EachKindOfRoundGivesEveryRankItsResult) {
  OwnComm comm;
  MpiControlChannel channel(comm.get(), /*spin_first=*/false);
  const int rank = Rank();
  const int size = Size();
  // Bit r of word 0 clear on rank r alone; word 1 all ones everywhere.
  std::vector<uint64_t> words = {~(uint64_t{1} << rank), ~uint64_t{0}};
  ASSERT_TRUE(channel.AllreduceAnd(&words).ok());
  const uint64_t cleared = size == 64 ? ~uint64_t{0} : (uint64_t{1} << size) - 1;
  EXPECT_EQ(words[0], ~cleared);
  EXPECT_EQ(words[1], ~uint64_t{0});

  std::vector<std::string> all;
  ASSERT_TRUE(channel.Gather(std::string(static_cast<size_t>(rank), 'x'), &all).ok());
  if (rank == 0) {
    ASSERT_EQ(all.size(), static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) EXPECT_EQ(all[r], std::string(static_cast<size_t>(r), 'x'));
  }
  std::string bytes = rank == 0 ? "from rank 0" : "";
  ASSERT_TRUE(channel.Broadcast(&bytes).ok());
  EXPECT_EQ(bytes, "from rank 0");
}

// The last rank joins a round a second late: the others, told to warn every 0.25 s, say what
// waits and for how long; the last one, whose round completes at once, says nothing, and a
// channel told never to warn says nothing however long it waits.
TEST(MpiControlChannelTest, ARoundThatWaitsLongSaysSoOnTheRanksThatWait) {
  const int rank = Rank();
  const int size = Size();
  if (size < 2) GTEST_SKIP() << "needs a rank to wait for";
  const bool late = rank == size - 1;
  for (const double every_seconds : {0.25, 0.0}) {
    OwnComm comm;
    MpiControlChannel channel(comm.get(), /*spin_first=*/false,
                              LongWait{every_seconds, "process set 7's negotiation"});
    std::vector<uint64_t> words = {~uint64_t{0}};
    ::testing::internal::CaptureStderr();
    if (late) std::this_thread::sleep_for(std::chrono::seconds(1));
    const Status status = channel.AllreduceAnd(&words);
    const std::string said = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(status.ok()) << status.ToString();
    if (late || every_seconds == 0) {
      EXPECT_EQ(said.find(kWaited), std::string::npos) << said;
    } else {
      EXPECT_NE(said.find("process set 7's negotiation: MPI_Iallreduce(negotiation bit vector) "
                          "has waited"),
                std::string::npos)
          << said;
      EXPECT_NE(said.find("background thread"), std::string::npos) << said;
    }
  }
}

// The last rank joins a round 3 s late (its background thread stuck in a callback): the others,
// told to give up after 0.5 s, fail with Stalled naming the round and the setting, and every later
// exchange of theirs fails with it at once, touching no MPI call. The late rank's round still
// completes (the others had joined it before giving up), with the bits they brought.
TEST(MpiControlChannelTest, ARoundThatWaitsPastTheStallShutdownTimeGivesUp) {
  const int rank = Rank();
  const int size = Size();
  if (size < 2) GTEST_SKIP() << "needs a rank to wait for";
  const bool late = rank == size - 1;
  OwnComm comm;
  MpiControlChannel channel(comm.get(), /*spin_first=*/false,
                            LongWait{0, "process set 7's negotiation", /*give_up_seconds=*/0.5});
  std::vector<uint64_t> words = {late ? ~uint64_t{0} : uint64_t{0x0f}};
  if (late) std::this_thread::sleep_for(std::chrono::seconds(3));
  const auto start = std::chrono::steady_clock::now();
  const Status status = channel.AllreduceAnd(&words);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (late) {
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(words, std::vector<uint64_t>{0x0f});
    return;
  }
  ASSERT_EQ(status.code(), StatusCode::kStalled) << status.ToString();
  EXPECT_GE(waited, 0.5);
  EXPECT_LT(waited, 2.5);
  EXPECT_NE(status.message().find("process set 7's negotiation: MPI_Iallreduce(negotiation bit "
                                  "vector) waited"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("GRADSYNC_STALL_SHUTDOWN_SECONDS"), std::string::npos);
  EXPECT_NE(status.message().find("background thread"), std::string::npos);

  std::string bytes = "unsent";
  std::vector<std::string> all;
  const Status gathered = channel.Gather("x", &all);
  const Status broadcast = channel.Broadcast(&bytes);
  EXPECT_EQ(gathered.ToString(), status.ToString());
  EXPECT_EQ(broadcast.ToString(), status.ToString());
  EXPECT_EQ(bytes, "unsent");
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
