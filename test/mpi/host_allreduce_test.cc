// The host allreduce paths of MpiDataPlane at 1, 2, 4 and 8 ranks: MPI messages, node shared memory
// folding every region (up to 4 ranks) and by slices (more), and the hierarchical allreduce over
// hosts simulated as groups of consecutive ranks (the real thing across network namespaces is the
// multihost test). Every dtype and op, in place and out of place, buckets smaller than the rank
// count, scales, and many buckets in a row so the double buffers and the result area are reused.
// AllreduceInPieces: no reduction sees more than a piece, and the pieces cover the buffer.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ops/mpi/hierarchical_allreduce.h"
#include "ops/mpi/mpi_data_plane.h"
#include "ops/mpi/mpi_types.h"
#include "ops/mpi/shared_memory_allreduce.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

constexpr int64_t kUnlimitedShm = int64_t{1} << 30;

// One tensor of a bucket: its input and, when reduced out of place, its own output.
struct Op {
  Op(const std::string& name, DataType dtype, int64_t elements, bool in_place)
      : input(dtype, {elements}), result(dtype, {elements}) {
    entry.name = name;
    entry.input = input.view();
    entry.output = in_place ? input.view() : result.view();
    entry.state = std::make_shared<OpState>();
  }
  // Kept in pieces of 0, 1, 2, ... elements (every length, the empty one included, with the
  // last piece taking what is left), reduced in place as TensorEntry::segments says.
  void CutIntoPieces() {
    const int64_t n = input.size();
    const size_t element = DataTypeSize(entry.input.dtype);
    auto* base = static_cast<char*>(input.view().data);
    for (int64_t at = 0, length = 0; at < n || pieces.empty(); ++length) {
      const int64_t take = std::min(length, n - at);
      pieces.push_back({base + static_cast<size_t>(at) * element, take});
      at += take;
    }
    entry.input.data = nullptr;
    entry.output = entry.input;
    entry.segments = pieces.data();
    entry.segment_count = pieces.size();
  }
  HostTensor& output() {
    return entry.segments != nullptr || entry.output.data == entry.input.data ? input : result;
  }

  TensorEntry entry;
  HostTensor input;
  HostTensor result;
  std::vector<HostSegment> pieces;
};

// Which path a plane takes, as the test names say.
struct PlaneShape {
  const char* name;
  int64_t shm_threshold;
  int ranks_per_host;           // 0: the real nodes (one, here)
  int64_t pipeline_chunk = 0;   // bytes; 0: buckets whole
  int64_t allreduce_piece = 0;  // bytes; 0: every MPI allreduce whole
};

void PrintTo(const PlaneShape& shape, std::ostream* out) { *out << shape.name; }

class HostAllreduceTest : public ::testing::TestWithParam<PlaneShape> {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), MPI_SUCCESS);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    const PlaneShape& shape = GetParam();
    SetRanksPerHostForTesting(shape.ranks_per_host);
    plane_ = std::make_unique<MpiDataPlane>(comm_, nullptr, shape.shm_threshold,
                                            shape.ranks_per_host > 0);
    plane_->set_pipeline_chunk_bytes(shape.pipeline_chunk);
    plane_->set_piece_bytes(shape.allreduce_piece);
  }
  void TearDown() override {
    plane_.reset();
    SetRanksPerHostForTesting(0);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    int failed_here = HasFailure() ? 1 : 0;
    int failed_anywhere = 0;
    MPI_Allreduce(&failed_here, &failed_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (failed_anywhere && !failed_here) ADD_FAILURE() << "this test failed on another rank";
  }

  // Reduces one bucket of tensors of `sizes` elements (every other one in place) holding
  // Value(op, rank, i + shift) and checks every element; `scale` is prescale times postscale.
  void ReduceAndCheck(DataType dtype, ReduceOp op, const std::vector<int64_t>& sizes,
                      int64_t shift = 0, double prescale = 1.0, double postscale = 1.0) {
    SCOPED_TRACE(DataTypeName(dtype) + " " + ReduceOpName(op));
    std::vector<std::unique_ptr<Op>> ops;
    std::vector<TensorEntry*> entries;
    for (size_t t = 0; t < sizes.size(); ++t) {
      ops.push_back(std::make_unique<Op>("t" + std::to_string(t), dtype, sizes[t], t % 2 == 1));
      for (int64_t i = 0; i < sizes[t]; ++i) ops[t]->input.Set(i, Value(op, rank_, i + shift));
      if (in_pieces_ && t % 3 == 0) ops[t]->CutIntoPieces();
      entries.push_back(&ops[t]->entry);
    }
    ReduceSpec spec;
    spec.dtype = dtype;
    spec.op = op;
    spec.prescale = prescale;
    spec.postscale = postscale;
    const Status status = plane_->Allreduce(entries, spec);
    ASSERT_TRUE(status.ok()) << status.ToString();
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (int64_t i = 0; i < sizes[t]; ++i) {
        double expected = Expected(op, dtype, size_, i + shift) * prescale * postscale;
        if (!IsFloatingPoint(dtype)) expected = std::trunc(expected);
        const double actual = ops[t]->output().Get(i);
        ASSERT_LE(std::abs(actual - expected), Tolerance(dtype, expected))
            << "tensor " << t << " element " << i << ": " << actual << " != " << expected;
      }
    }
    ExpectSameBitsOnEveryRank(ops);
  }

  // Every rank must hold the same bits, or replicas drift apart step by step.
  void ExpectSameBitsOnEveryRank(const std::vector<std::unique_ptr<Op>>& ops) {
    uint64_t hash = 1469598103934665603ull;
    for (const auto& op : ops) {
      const TensorView output = op->output().view();
      const auto* bytes = static_cast<const unsigned char*>(output.data);
      for (int64_t b = 0; b < output.num_bytes(); ++b) hash = (hash ^ bytes[b]) * 1099511628211ull;
    }
    uint64_t lowest = hash, highest = hash;
    MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lowest, highest) << "the ranks' results differ in their bits";
  }

  int rank_ = 0;
  int size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<MpiDataPlane> plane_;
  bool in_pieces_ = false;  // every third tensor kept in pieces
};

TEST_P(HostAllreduceTest, FusedBucketsEveryDtypeAndOp) {
  for (DataType dtype : AllDataTypes()) {
    for (ReduceOp op : kAllReduceOps) {
      ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(dtype, op, {0, 1, 3, 17, 100, 7, 64, 1000}));
    }
  }
}

TEST_P(HostAllreduceTest, LoneTensorsEveryDtype) {
  for (DataType dtype : AllDataTypes()) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{4099}}) {
      ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(dtype, ReduceOp::kSum, {n}));
    }
  }
}

// Past 256 KiB, 3 and 4 ranks reduce by slices too.
TEST_P(HostAllreduceTest, LargeBuckets) {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
    ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(dtype, ReduceOp::kSum, {70001, 3, 9000}));
  }
  ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(DataType::kFloat64, ReduceOp::kMax, {40000, 1}));
}

// Fewer elements than ranks: most slices are empty.
TEST_P(HostAllreduceTest, BucketsSmallerThanTheRankCount) {
  ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(DataType::kFloat32, ReduceOp::kSum, {1, 1}));
  ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(DataType::kInt8, ReduceOp::kMax, {2, 0, 1}));
}

TEST_P(HostAllreduceTest, ScalesApplyOnce) {
  ASSERT_NO_FATAL_FAILURE(
      ReduceAndCheck(DataType::kFloat64, ReduceOp::kSum, {3, 300, 33}, 0, 2.0, 0.25));
  ASSERT_NO_FATAL_FAILURE(
      ReduceAndCheck(DataType::kFloat32, ReduceOp::kAverage, {4097}, 0, 4.0, 1.0));
}

// Consecutive buckets of changing sizes reuse both buffers and the result area; a rank that wrote
// too early would corrupt another rank's reads.
TEST_P(HostAllreduceTest, ManyBucketsInARow) {
  for (int64_t step = 0; step < 60; ++step) {
    const int64_t n = 1 + (step * 37) % 5000;
    ASSERT_NO_FATAL_FAILURE(
        ReduceAndCheck(DataType::kFloat32, ReduceOp::kSum, {n, 3, n / 2 + 1}, step));
  }
}

// Tensors kept in pieces (AllreduceBatch's buckets), alone and fused, beside whole ones: every
// path copies through the pieces and gets the whole tensors' results.
TEST_P(HostAllreduceTest, TensorsInPieces) {
  in_pieces_ = true;
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
    ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(dtype, ReduceOp::kSum, {100, 3, 17, 0, 64, 1000}));
    ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(dtype, ReduceOp::kMax, {4099}));
  }
  ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(DataType::kFloat32, ReduceOp::kSum, {70001, 3, 9000}));
  ASSERT_NO_FATAL_FAILURE(
      ReduceAndCheck(DataType::kFloat64, ReduceOp::kAverage, {300, 33, 3}, 0, 2.0, 0.25));
  for (int64_t step = 0; step < 10; ++step) {
    const int64_t n = 1 + (step * 37) % 5000;
    ASSERT_NO_FATAL_FAILURE(
        ReduceAndCheck(DataType::kFloat32, ReduceOp::kSum, {n, 3, n / 2 + 1}, step));
  }
}

// A lone tensor in pieces on some ranks and whole on others (a joined rank's stand-in beside a
// batch's bucket of one): every path must issue the same collectives either way.
TEST_P(HostAllreduceTest, ALoneTensorInPiecesOnSomeRanksOnly) {
  in_pieces_ = rank_ % 2 == 0;
  for (int64_t n : {int64_t{4099}, int64_t{70001}, int64_t{1}}) {
    ASSERT_NO_FATAL_FAILURE(ReduceAndCheck(DataType::kFloat32, ReduceOp::kSum, {n}));
    ASSERT_NO_FATAL_FAILURE(
        ReduceAndCheck(DataType::kFloat64, ReduceOp::kAverage, {n}, 0, 2.0, 0.25));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Paths, HostAllreduceTest,
    ::testing::Values(PlaneShape{"MpiMessages", 0, 0},
                      // Chunks of 256 bytes: boundaries inside tensors and
                      // gaps, many chunks in flight one after another.
                      PlaneShape{"MpiMessagesPipelined", 0, 0, 256},
                      // MPI allreduces in pieces of 192 bytes: boundaries
                      // inside tensors, elements of every size, a last
                      // piece shorter than the rest.
                      PlaneShape{"MpiMessagesInPieces", 0, 0, 0, 192},
                      PlaneShape{"SharedMemory", kUnlimitedShm, 0},
                      PlaneShape{"HierarchicalTwoPerHost", kUnlimitedShm, 2},
                      PlaneShape{"HierarchicalFourPerHost", kUnlimitedShm, 4},
                      PlaneShape{"HierarchicalWithoutSharedMemory", 0, 2},
                      PlaneShape{"HierarchicalInPieces", kUnlimitedShm, 2, 0, 192},
                      PlaneShape{"HierarchicalWithoutSharedMemoryInPieces", 0, 2, 0, 192},
                      PlaneShape{"HierarchicalSmallSharedMemory", 4096, 2}),
    [](const ::testing::TestParamInfo<PlaneShape>& info) { return info.param.name; });

// The hierarchy is taken exactly when there are several hosts with the same number of ranks, more
// than one, on each.
TEST(HierarchicalAllreduce, AppliesOnlyToEvenHostsOfSeveralRanks) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int per_host : {1, 2, 3, 4}) {
    SetRanksPerHostForTesting(per_host);
    HierarchicalAllreduce hierarchical(MPI_COMM_WORLD, true, 0);
    bool applies = false;
    ASSERT_TRUE(hierarchical.Applies(&applies).ok());
    const bool expected = per_host > 1 && size % per_host == 0 && size / per_host > 1;
    EXPECT_EQ(applies, expected) << per_host << " ranks per host of " << size;
  }
  SetRanksPerHostForTesting(0);
}

// A float sum that records the most elements MPI handed it at once. MPI applies an op to no more
// elements than one call's count, so a piece size shows as a bound on it.
int64_t most_elements_folded = 0;
void RecordingSum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  most_elements_folded = std::max<int64_t>(most_elements_folded, *len);
  for (int i = 0; i < *len; ++i) static_cast<float*>(inout)[i] += static_cast<float*>(in)[i];
}

TEST(AllreduceInPieces, NoReductionSeesMoreThanAPiece) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Op sum = MPI_OP_NULL;
  ASSERT_EQ(MPI_Op_create(&RecordingSum, /*commute=*/1, &sum), MPI_SUCCESS);
  // Piece sizes in bytes: whole, 48 floats, a size that is no whole number of floats, less than
  // one float (one each), and more than the buffer.
  for (int64_t piece :
       {int64_t{0}, int64_t{192}, int64_t{4 * 7 + 2}, int64_t{3}, int64_t{1 << 20}}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{48}, int64_t{1001}}) {
      for (bool in_place : {true, false}) {
        SCOPED_TRACE("piece " + std::to_string(piece) + ", count " + std::to_string(count) +
                     (in_place ? ", in place" : ", out of place"));
        std::vector<float> input(static_cast<size_t>(count)), output(input.size(), -1.0f);
        for (int64_t i = 0; i < count; ++i) input[i] = float(rank + 1) * float(i % 7);
        if (in_place) output = input;
        most_elements_folded = 0;
        const Status status =
            AllreduceInPieces(in_place ? MPI_IN_PLACE : input.data(), output.data(), count,
                              sizeof(float), MPI_FLOAT, sum, MPI_COMM_WORLD, piece);
        ASSERT_TRUE(status.ok()) << status.ToString();
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(output[i], float(size * (size + 1) / 2) * float(i % 7)) << "element " << i;
        }
        const int64_t per_piece = piece == 0 ? count : std::max<int64_t>(1, piece / 4);
        EXPECT_LE(most_elements_folded, std::min(count, per_piece));
        // Whole, MPI folds more than a piece would hold (a check that the bound above can fail).
        // At a rank count that is no power of two, MPI may leave a rank folding nothing.
        if (size > 1 && (size & (size - 1)) == 0 && piece == 0 && count == 1001) {
          EXPECT_GT(most_elements_folded, 48);
        }
      }
    }
  }
  MPI_Op_free(&sum);
}

// The hooks see each piece once, in order, right around its allreduce: `before` while the piece
// still holds this rank's input, `after` once it holds the sum; and scaling hooks scale each piece
// once on its way in (from an input kept apart or in place) and once on its way out.
TEST(AllreduceInPieces, HooksWorkOnEachPieceOnce) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const double sum_of_ranks = double(size * (size + 1) / 2);
  for (int64_t piece : {int64_t{0}, int64_t{8 * 5}, int64_t{3}}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{333}}) {
      SCOPED_TRACE("piece " + std::to_string(piece) + ", count " + std::to_string(count));
      std::vector<double> input(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) input[i] = double(rank + 1) * double(i % 5);
      const size_t bytes = input.size() * sizeof(double);

      std::vector<double> output = input;
      std::vector<std::pair<size_t, size_t>> seen;
      PieceHooks hooks;
      hooks.before = [&](size_t begin, size_t end) {
        seen.emplace_back(begin, end);
        for (size_t i = begin / 8; i < end / 8; ++i) ASSERT_EQ(output[i], input[i]);
      };
      hooks.after = [&](size_t begin, size_t end) {
        ASSERT_EQ(seen.back(), std::make_pair(begin, end));
        for (size_t i = begin / 8; i < end / 8; ++i) {
          ASSERT_EQ(output[i], sum_of_ranks * double(i % 5));
        }
      };
      Status status = AllreduceInPieces(MPI_IN_PLACE, output.data(), count, sizeof(double),
                                        MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, piece, hooks);
      ASSERT_TRUE(status.ok()) << status.ToString();
      size_t covered = 0;
      for (const auto& [begin, end] : seen) {
        EXPECT_EQ(begin, covered);
        EXPECT_LE(end - begin, piece == 0 ? bytes : std::max<size_t>(8, size_t(piece) / 8 * 8));
        covered = end;
      }
      EXPECT_EQ(covered, bytes);

      for (bool in_place : {true, false}) {
        SCOPED_TRACE(in_place ? "scaled in place" : "scaled from an input kept apart");
        const std::vector<double> original = input;
        std::vector<double> result = in_place ? input : std::vector<double>(input.size(), -1.0);
        const void* from = in_place ? static_cast<const void*>(result.data()) : input.data();
        status = AllreduceInPieces(
            MPI_IN_PLACE, result.data(), count, sizeof(double), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD,
            piece, ScalingHooks(from, result.data(), DataType::kFloat64, 2.0, 0.25));
        ASSERT_TRUE(status.ok()) << status.ToString();
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(result[i], sum_of_ranks * double(i % 5) * 0.5) << "element " << i;
        }
        EXPECT_EQ(input, original);
      }
    }
  }
  // A piece that a hook fills is reduced in place: a separate input would be ignored.
  double one = 1.0, out = 0.0;
  PieceHooks fill;
  fill.before = [](size_t, size_t) {};
  EXPECT_EQ(
      AllreduceInPieces(&one, &out, 1, sizeof(double), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, 0, fill)
          .code(),
      StatusCode::kInvalidArgument);
}

// A setting missing on some rank must not split the ranks between two paths.
TEST(HierarchicalAllreduce, RanksThatDisagreeStayFlatTogether) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  SetRanksPerHostForTesting(2);
  for (bool everyone : {false, true}) {
    HierarchicalAllreduce hierarchical(MPI_COMM_WORLD, everyone || rank % 2 == 0, 0);
    bool applies = false;
    ASSERT_TRUE(hierarchical.Applies(&applies).ok());
    const bool expected = everyone && size % 2 == 0 && size >= 4;
    EXPECT_EQ(applies, expected) << (everyone ? "every rank asked" : "even ranks asked");
  }
  SetRanksPerHostForTesting(0);
}

TEST(SliceOf, PartsCoverTheBucketOnCacheLineBoundaries) {
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17},
                        int64_t{1000}, int64_t{4099}}) {
    for (size_t elem_size : {size_t{1}, size_t{2}, size_t{4}, size_t{8}}) {
      for (int parts : {1, 2, 3, 8, 64}) {
        int64_t next = 0;
        for (int p = 0; p < parts; ++p) {
          const ElementRange slice = SliceOf(count, elem_size, parts, p);
          ASSERT_EQ(slice.begin, next) << count << " " << elem_size << " " << parts << " " << p;
          ASSERT_LE(slice.begin, slice.end);
          if (slice.end != count) {
            EXPECT_EQ(slice.end * static_cast<int64_t>(elem_size) % 64, 0);
          }
          next = slice.end;
        }
        EXPECT_EQ(next, count);
      }
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
