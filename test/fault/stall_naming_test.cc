// A rank that stays alive but stops submitting is named by the stall inspector, and every pending
// handle of every other rank fails with that one message: whichever rank goes missing (rank 0,
// the coordinator, included), with several tensors pending, and with several ranks missing. The
// missing ranks' own next operation is refused with the same message. Run with short stall
// settings (see CMakeLists.txt).
#include <algorithm>
#include <string>
#include <vector>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

constexpr int kPending = 5;

// Rank `root`'s string, on every rank.
std::string BroadcastString(std::string text, int root) {
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, root, MPI_COMM_WORLD);
  text.resize(static_cast<size_t>(length));
  MPI_Bcast(&text[0], length, MPI_CHAR, root, MPI_COMM_WORLD);
  return text;
}

std::string MessageOf(const Handle& handle) {
  try {
    if (!handle.wait_for(kWaitLimit)) return "still pending after the wait limit";
  } catch (const Error& e) {
    return e.what();
  }
  return "succeeded";
}

class StallNamingTest : public MultiRankTest {
 protected:
  // The ranks in `missing` submit nothing; the others submit kPending tensors. Checks every
  // handle of every submitting rank, and the enqueue the missing ranks try afterwards.
  void ExpectNamed(const std::vector<int>& missing, const std::string& named_as) {
    bool is_missing = false;
    for (int r : missing) is_missing |= r == rank_;
    int first_present = 0;
    while (std::find(missing.begin(), missing.end(), first_present) != missing.end()) {
      ++first_present;
    }
    std::vector<float> data(kPending * 4, 1.0f);
    std::string message;
    if (!is_missing) {
      std::vector<Handle> handles;
      for (int t = 0; t < kPending; ++t) {
        AllreduceOptions options;
        options.name = "stalled." + std::to_string(t);
        handles.push_back(allreduce(TensorView(&data[t * 4], DataType::kFloat32, {4}), options));
      }
      message = MessageOf(handles.front());
      EXPECT_EQ(message.rfind("Stalled: ", 0), 0u) << message;
      EXPECT_NE(message.find(named_as + " (ready on"), std::string::npos) << message;
      for (int t = 0; t < kPending; ++t) {
        EXPECT_NE(message.find("tensor 'stalled." + std::to_string(t) + "'"), std::string::npos)
            << message;
        EXPECT_EQ(MessageOf(handles[t]), message) << "handle " << t;
      }
    }
    // The missing ranks' background threads keep negotiating while their callers are away; they
    // come back once the others have seen the failure, which outside gradsync is a plain barrier.
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string reference = BroadcastString(message, first_present);
    if (!is_missing) {
      EXPECT_EQ(message, reference) << "ranks were told different things";
    } else {
      // This rank's background thread may learn of the stall a moment after the others: the
      // enqueue is then still accepted, and its handle fails instead.
      Handle late;
      std::string refused;
      try {
        late = allreduce(TensorView(data.data(), DataType::kFloat32, {4}));
      } catch (const Error& e) {
        refused = e.what();
      }
      if (late.valid()) refused = MessageOf(late);
      EXPECT_EQ(refused, reference) << "the missing rank was told something else";
    }
  }
};

TEST_F(StallNamingTest, MissingCoordinatorIsNamedOnEveryRank) {
  if (size_ < 2) GTEST_SKIP() << "a single rank cannot stall";
  ExpectNamed({0}, "missing on rank 0");
}

TEST_F(StallNamingTest, MissingLastRankIsNamedOnEveryRank) {
  if (size_ < 2) GTEST_SKIP() << "a single rank cannot stall";
  ExpectNamed({size_ - 1}, "missing on rank " + std::to_string(size_ - 1));
}

TEST_F(StallNamingTest, SeveralMissingRanksAreAllNamed) {
  if (size_ < 3) GTEST_SKIP() << "needs two missing ranks and one present";
  std::vector<int> missing;
  std::string listed;
  for (int r = 1; r < size_; ++r) {
    missing.push_back(r);
    listed += (listed.empty() ? "" : ", ") + std::to_string(r);
  }
  ExpectNamed(missing, "missing on ranks " + listed);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
