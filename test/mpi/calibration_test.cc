// Calibration of the MPI plane's allreduce paths at 2 and 4 ranks: every rank gets the same
// samples (so the same fitted costs and the same plan), the samples cover the ladder, the plane
// still reduces correctly afterwards and leaves nothing in the timeline, and the fitted settings
// stay within their bounds; a ladder out of time stops at the same size on every rank. The piece
// probe: every rank gets the same samples and choice, and the plane reduces correctly in the
// pieces chosen.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "coordinator/cost_model.h"
#include "ops/mpi/mpi_data_plane.h"
#include "runtime/config.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

class CalibrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), MPI_SUCCESS);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  void TearDown() override { MPI_Comm_free(&comm_); }

  // Every rank's copy of `values`, compared with rank 0's.
  bool SameOnEveryRank(const std::vector<double>& values) {
    std::vector<double> first = values;
    MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_DOUBLE, 0, comm_);
    int same = first == values ? 1 : 0, all = 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, comm_);
    return all == 1;
  }

  int rank_ = 0, size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

std::vector<double> Flatten(const AllreduceCalibration& c) {
  std::vector<double> values;
  for (const auto* list : {&c.in_place, &c.fused}) {
    for (const CostSample& s : *list)
      values.insert(values.end(), {s.bytes, double(s.tensors), s.us});
  }
  return values;
}

TEST_F(CalibrationTest, EveryRankFitsTheSameCostsAndThePlaneStillReduces) {
  for (int64_t shm : {int64_t{16} << 20, int64_t{0}}) {  // node shared memory, then MPI messages
    Timeline timeline;  // never started: calibration must not record into it anyway
    MpiDataPlane plane(comm_, &timeline, shm);
    AllreduceCalibration measured;
    ASSERT_TRUE(plane.Calibrate(true, &measured, Config().calibration_seconds).ok());
    EXPECT_TRUE(measured.fused_hierarchical.empty());  // one host: nothing to compare
    ASSERT_EQ(measured.in_place.size(), 5u);
    ASSERT_EQ(measured.fused.size(), 5u);
    EXPECT_EQ(measured.sizes_skipped, 0);
    for (const CostSample& s : measured.fused) {
      EXPECT_GT(s.us, 0);
      EXPECT_GE(s.tensors, 2);
    }
    EXPECT_GT(measured.seconds, 0);
    EXPECT_TRUE(SameOnEveryRank(Flatten(measured))) << "shm threshold " << shm;

    AllreduceCosts costs;
    costs.in_place = FitLinearCost(measured.in_place, kPerByte | kPerTensor);
    costs.fused = FitLinearCost(measured.fused, kFixed | kPerByte | kPerTensor);
    const int64_t cutoff = InPlaceCutoff(costs);
    EXPECT_GE(cutoff, kSmallestInPlace);
    const int64_t cap = FusedBucketCap(costs, 8 << 20, 64 << 20, 32 << 20);
    EXPECT_GE(cap, 8 << 20);
    EXPECT_LE(cap, 64 << 20);
    EXPECT_TRUE(SameOnEveryRank({double(cutoff), double(cap)}));

    // The plane after calibration: a fused bucket of three tensors sums exactly.
    std::vector<std::vector<float>> data(3, std::vector<float>(1000, float(rank_ + 1)));
    std::vector<TensorEntry> entries(3);
    std::vector<TensorEntry*> members;
    for (int i = 0; i < 3; ++i) {
      entries[i].name = "after." + std::to_string(i);
      entries[i].input = TensorView(data[i].data(), DataType::kFloat32, {1000});
      entries[i].output = entries[i].input;
      members.push_back(&entries[i]);
    }
    ASSERT_TRUE(plane.Allreduce(members, ReduceSpec{}).ok());
    const float expected = float(size_ * (size_ + 1) / 2);
    for (const auto& tensor : data) {
      for (float v : tensor) ASSERT_EQ(v, expected);
    }
  }
}

// Without time for more, the ladder times its smallest size only, the same on every rank, and the
// plane is left as it was: pieces as set, every path still exact. Only rank 0 has no time: the
// smallest budget applies on every rank.
TEST_F(CalibrationTest, TheLadderStopsWhereItsBudgetRunsOut) {
  MpiDataPlane plane(comm_, nullptr, 0);
  plane.set_piece_bytes(4096);
  AllreduceCalibration measured;
  ASSERT_TRUE(plane.Calibrate(false, &measured, /*budget_seconds=*/rank_ == 0 ? 0 : 3600).ok());
  ASSERT_EQ(measured.fused.size(), 1u);
  ASSERT_EQ(measured.in_place.size(), 1u);
  EXPECT_EQ(measured.sizes_skipped, 4);
  EXPECT_EQ(measured.budget_seconds, 0.0);
  EXPECT_EQ(measured.fused[0].tensors, 64);
  EXPECT_EQ(measured.fused[0].bytes, 64.0 * 4096);
  EXPECT_TRUE(SameOnEveryRank(Flatten(measured)));
  EXPECT_EQ(plane.piece_bytes(), 4096);

  std::vector<float> alone(20000, float(rank_ + 1));
  TensorEntry entry;
  entry.name = "after.budget";
  entry.input = TensorView(alone.data(), DataType::kFloat32, {20000});
  entry.output = entry.input;
  ASSERT_TRUE(plane.Allreduce({&entry}, ReduceSpec{}).ok());
  for (float v : alone) ASSERT_EQ(v, float(size_ * (size_ + 1) / 2));
}

TEST_F(CalibrationTest, EveryRankChoosesTheSamePiecesAndThePlaneReducesInThem) {
  for (int64_t shm : {int64_t{16} << 20, int64_t{0}}) {
    MpiDataPlane plane(comm_, nullptr, shm);
    std::vector<PieceSample> samples;
    const Status probed = plane.CalibratePieces(&samples);
    ASSERT_TRUE(probed.ok()) << probed.ToString();
    const size_t candidates = std::size(kPieceCandidates);
    ASSERT_EQ(samples.size(), 1 + candidates);
    EXPECT_EQ(samples[0].piece_bytes, 0);  // whole
    std::vector<double> values;
    for (size_t i = 0; i < samples.size(); ++i) {
      EXPECT_GT(samples[i].us, 0);
      if (i > 0) {
        EXPECT_EQ(samples[i].piece_bytes, kPieceCandidates[i - 1]);
      }
      values.insert(values.end(), {double(samples[i].piece_bytes), samples[i].us});
    }
    EXPECT_TRUE(SameOnEveryRank(values));
    const int64_t chosen = ChoosePieceBytes(samples);
    EXPECT_TRUE(SameOnEveryRank({double(chosen)}));

    // Whatever was chosen, and pieces much smaller than a tensor, reduce exactly.
    for (int64_t piece : {chosen, int64_t{4096}}) {
      plane.set_piece_bytes(piece);
      std::vector<float> alone(300000, float(rank_ + 1));
      std::vector<float> fused(70000, float(rank_ + 1));
      std::vector<TensorEntry> entries(2);
      entries[0].name = "pieces.alone";
      entries[0].input = TensorView(alone.data(), DataType::kFloat32, {300000});
      entries[1].name = "pieces.fused";
      entries[1].input = TensorView(fused.data(), DataType::kFloat32, {70000});
      for (TensorEntry& e : entries) e.output = e.input;
      ASSERT_TRUE(plane.Allreduce({&entries[0]}, ReduceSpec{}).ok());
      ASSERT_TRUE(plane.Allreduce({&entries[1], &entries[0]}, ReduceSpec{}).ok());
      const float once = float(size_ * (size_ + 1) / 2);
      for (float v : fused) ASSERT_EQ(v, once) << "piece " << piece;
      for (float v : alone) ASSERT_EQ(v, once * float(size_)) << "piece " << piece;
    }
  }
}

// What the coordinator makes of calibration, in rank 0's log: the costs and the plan from them,
// or, with too few sizes timed, the configured settings and a warning that says how to avoid the
// wait. Either way the set's first allreduce, which waited for it, is exact.
class CalibrationLogTest : public MultiRankTest, public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override {
    setenv("GRADSYNC_CALIBRATION_SECONDS", GetParam(), 1);
    setenv("GRADSYNC_LOG_LEVEL", "info", 1);
    ::testing::internal::CaptureStderr();
    capturing_ = true;
    MultiRankTest::SetUp();
  }
  void TearDown() override {
    TakeLog();
    MultiRankTest::TearDown();
    unsetenv("GRADSYNC_CALIBRATION_SECONDS");
    unsetenv("GRADSYNC_LOG_LEVEL");
  }
  // What was logged since SetUp; ends the capture.
  std::string TakeLog() {
    if (!capturing_) return {};
    capturing_ = false;
    return ::testing::internal::GetCapturedStderr();
  }

 private:
  bool capturing_ = false;
};

TEST_P(CalibrationLogTest, RankZeroSaysWhatThePlanCameFrom) {
  const bool no_time = std::string(GetParam()) == "0";
  HostTensor tensor(DataType::kFloat32, {1000});
  for (int64_t i = 0; i < tensor.size(); ++i) tensor.Set(i, rank_ + 1);
  AllreduceOptions options;
  options.name = "calibration.log";
  options.op = ReduceOp::kSum;
  const bool reduced = Succeeds(allreduce(tensor.view(), options));
  const std::string log = TakeLog();  // calibration ran before the allreduce
  ASSERT_TRUE(reduced);
  EXPECT_EQ(tensor.Get(999), size_ * (size_ + 1) / 2);
  if (rank_ != 0) return;
  const bool warned = log.find("too few to fit costs") != std::string::npos;
  const bool fitted =
      log.find("allreduce costs on " + std::to_string(size_) + " ranks") != std::string::npos;
  EXPECT_EQ(warned, no_time) << log;
  EXPECT_EQ(fitted, !no_time) << log;
  if (no_time) {
    EXPECT_NE(log.find("GRADSYNC_CALIBRATE=0"), std::string::npos) << log;
  }
}

INSTANTIATE_TEST_SUITE_P(Budgets, CalibrationLogTest, ::testing::Values("0", "60"));

}  // namespace
}  // namespace testing
}  // namespace gradsync
