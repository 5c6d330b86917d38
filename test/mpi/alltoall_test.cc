// Alltoall across ranks: explicit uneven splits for every dtype, equal splits by default (rows
// that do not divide refused), empty inputs, the received splits, and validation errors at
// enqueue.
#include <sys/mman.h>

#include <memory>

#include "ops/data_plane.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

constexpr int64_t kWidth = 2;  // elements per row

// Every element of the rows `sender` sends `receiver` carries this tag; row `row` of that slice.
// Small enough for int8 at 4 ranks.
double Tag(int sender, int receiver, int64_t row) { return sender * 16 + receiver * 4 + row % 4; }

AlltoallOptions Named(const std::string& name) {
  AlltoallOptions options;
  options.name = name;
  return options;
}

class AlltoallTest : public MultiRankTest {
 protected:
  // Sends splits_of(sender)[d] tagged rows to each rank d and checks what arrives.
  void RunAndCheck(DataType dtype, const std::function<std::vector<int64_t>(int)>& splits_of,
                   bool pass_splits, const std::string& name) {
    const std::vector<int64_t> mine = splits_of(rank_);
    int64_t rows = 0;
    for (int64_t s : mine) rows += s;
    HostTensor in(dtype, {rows, kWidth});
    int64_t at = 0;
    for (int d = 0; d < size_; ++d) {
      for (int64_t row = 0; row < mine[d]; ++row) {
        for (int64_t c = 0; c < kWidth; ++c) in.Set(at++, Tag(rank_, d, row));
      }
    }
    std::unique_ptr<HostTensor> out;
    AlltoallOptions options;
    options.name = name;
    if (pass_splits) options.splits = mine;
    Handle h = alltoall(in.view(), Into(&out), options);
    ASSERT_TRUE(Succeeds(h));

    std::vector<int64_t> expected_received;
    int64_t total = 0;
    for (int s = 0; s < size_; ++s) {
      expected_received.push_back(splits_of(s)[rank_]);
      total += expected_received.back();
    }
    EXPECT_EQ(h.received_splits(), expected_received);
    ASSERT_EQ(h.output_shape(), (std::vector<int64_t>{total, kWidth}));
    if (total == 0) return;
    ASSERT_NE(out, nullptr);
    at = 0;
    for (int s = 0; s < size_; ++s) {
      for (int64_t row = 0; row < expected_received[s]; ++row) {
        for (int64_t c = 0; c < kWidth; ++c, ++at) {
          ASSERT_EQ(out->Get(at), Tag(s, rank_, row))
              << DataTypeName(dtype) << " from rank " << s << " row " << row;
        }
      }
    }
  }
};

// Every rank sends all its rows to rank 0, which then receives more bytes than MPI_Alltoallv's int
// counts carry, though no rank sends that many: every rank fails, where the others waited in
// MPI_Alltoallv for rank 0. The input is reserved address space that is never touched.
TEST_F(AlltoallTest, MoreThanTwoGibibytesArrivingAtOneRankFailsEveryRank) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks sending to one";
  const int64_t rows = int64_t{1100} << 20;  // 1.1 GB of uint8 from each rank
  void* reserved = mmap(nullptr, static_cast<size_t>(rows), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(reserved, MAP_FAILED);
  AlltoallOptions options = Named("a2a.oversized");
  options.splits.assign(size_, 0);
  options.splits[0] = rows;
  std::unique_ptr<HostTensor> out;
  const Handle h = alltoall(TensorView(reserved, DataType::kUInt8, {rows}), Into(&out), options);
  EXPECT_TRUE(FailsWith(
      h, StatusCode::kUnsupported,
      rank_ == 0 ? "MPI_Alltoallv's int byte counts" : "another rank would receive more"));
  munmap(reserved, static_cast<size_t>(rows));
}

TEST_F(AlltoallTest, UnevenSplitsEveryDtype) {
  // Rank s sends (s + d + 1) % 3 rows to rank d: some pairs exchange nothing.
  auto splits_of = [this](int s) {
    std::vector<int64_t> splits;
    for (int d = 0; d < size_; ++d) splits.push_back((s + d + 1) % 3);
    return splits;
  };
  int index = 0;
  for (DataType dtype : AllDataTypes()) {
    RunAndCheck(dtype, splits_of, true, "a2a.uneven." + std::to_string(index++));
  }
}

TEST_F(AlltoallTest, DefaultSplitsAreEqual) {
  auto splits_of = [this](int) { return std::vector<int64_t>(size_, 3); };
  RunAndCheck(DataType::kFloat32, splits_of, false, "a2a.even");
}

TEST_F(AlltoallTest, WithoutSplitsRowsThatDoNotDivideAreRefused) {
  if (size_ == 1) GTEST_SKIP() << "every count divides by one rank";
  HostTensor in(DataType::kFloat32, {2 * size_ + 1, kWidth});
  std::unique_ptr<HostTensor> out;
  EXPECT_TRUE(ThrowsWith([&] { alltoall(in.view(), Into(&out), Named("a2a.uneven.default")); },
                         StatusCode::kInvalidArgument, "divisible by the"));
  // The name is free again, and the same rows go with splits.
  AlltoallOptions options = Named("a2a.uneven.default");
  options.splits = EvenSplits(2 * size_ + 1, size_);
  ASSERT_TRUE(Succeeds(alltoall(in.view(), Into(&out), options)));
}

TEST_F(AlltoallTest, EmptyInputs) {
  auto splits_of = [this](int) { return std::vector<int64_t>(size_, 0); };
  RunAndCheck(DataType::kInt64, splits_of, true, "a2a.empty");
  RunAndCheck(DataType::kInt64, splits_of, false, "a2a.empty.default");
}

TEST_F(AlltoallTest, LargeSlices) {
  auto splits_of = [this](int s) { return std::vector<int64_t>(size_, (1 << 16) + s); };
  RunAndCheck(DataType::kFloat64, splits_of, true, "a2a.large");
}

TEST_F(AlltoallTest, BadSplitsAreRefusedAtEnqueue) {
  HostTensor in(DataType::kFloat32, {6, kWidth});
  std::unique_ptr<HostTensor> out;
  auto with = [&](std::vector<int64_t> splits) {
    AlltoallOptions options;
    options.name = "a2a.bad";
    options.splits = std::move(splits);
    return [&in, &out, options] { alltoall(in.view(), Into(&out), options); };
  };
  EXPECT_TRUE(ThrowsWith(with(std::vector<int64_t>(size_ + 1, 0)), StatusCode::kInvalidArgument,
                         "splits for"));
  std::vector<int64_t> negative(size_, 0);
  negative[0] = -1;
  if (size_ > 1) negative[size_ - 1] = 7;  // adds up, so only the sign is wrong
  EXPECT_TRUE(ThrowsWith(with(negative), StatusCode::kInvalidArgument, "negative"));
  std::vector<int64_t> short_of(size_, 0);
  short_of[0] = 5;
  EXPECT_TRUE(ThrowsWith(with(short_of), StatusCode::kInvalidArgument, "add up to 5"));
  std::vector<int64_t> over(size_, 0);
  over[0] = 7;
  EXPECT_TRUE(ThrowsWith(with(over), StatusCode::kInvalidArgument, "more than"));
  HostTensor scalar(DataType::kFloat32, {});
  EXPECT_TRUE(ThrowsWith([&] { alltoall(scalar.view(), Into(&out), Named("a2a.scalar")); },
                         StatusCode::kInvalidArgument, "scalar"));
}

TEST_F(AlltoallTest, MismatchedTrailingDimsFailOnEveryRank) {
  HostTensor in(DataType::kFloat32, {static_cast<int64_t>(size_), rank_ == 0 ? 2 : 3});
  std::unique_ptr<HostTensor> out;
  Handle h = alltoall(in.view(), Into(&out), Named("a2a.mismatch"));
  if (size_ > 1) {
    EXPECT_TRUE(FailsWith(h, StatusCode::kMismatch, "shape"));
  } else {
    EXPECT_TRUE(Succeeds(h));
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
