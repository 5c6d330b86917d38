// MpiControlChannel at 1, 2 and 4 ranks: its rounds' results, and a round that waits long for a
// rank, which the waiting ranks report instead of waiting in silence. negotiator_test and the
// collective tests run the channel through negotiation.
#include "coordinator/mpi_control_channel.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

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

// A communicator of the test's own, freed with it.
class OwnComm {
 public:
  OwnComm() { MPI_Comm_dup(MPI_COMM_WORLD, &comm_); }
  ~OwnComm() { MPI_Comm_free(&comm_); }
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
                              LongWaitWarning{every_seconds, "process set 7's negotiation"});
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

}  // namespace
}  // namespace testing
}  // namespace gradsync
