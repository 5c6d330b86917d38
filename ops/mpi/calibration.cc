// MpiDataPlane::Calibrate: the plane's own allreduce paths timed on synthetic float32 tensors.
// MpiDataPlane::CalibratePieces: one large allreduce timed whole and in pieces of several sizes.
// At each size of a ladder, tensors are reduced each way: two alone one after another, k as one
// fused bucket (and, when comparing, k as one bucket through the flat and through the
// hierarchical path), the ways taking turns so that a machine that slows down in the middle slows
// them all alike. (Two alone, not k: over a network each costs milliseconds.) Every rank keeps the
// slowest rank's medians, so every rank fits the same costs and plans the same buckets. The
// ladder climbs only while it stays within its time budget (GRADSYNC_CALIBRATION_SECONDS), the
// smallest any rank was given.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iterator>
#include <string>

#include "ops/mpi/mpi_data_plane.h"
#include "ops/mpi/mpi_types.h"
#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

struct Rung {
  int tensors;  // in a fused bucket
  int64_t bytes_each;
};
constexpr int kAlone = 2;

// From biases to large layers; buckets of up to 8 MiB, within the default shared-memory limit.
constexpr Rung kLadder[] = {
    {64, 4 << 10}, {64, 64 << 10}, {16, 256 << 10}, {4, 1 << 20}, {2, 4 << 20}};
constexpr int kRepetitions = 3;  // after one warm-up round
// A rung whose warm-up round took longer than this is timed once more only: over a slow network
// the ladder would otherwise take seconds.
constexpr double kSlowRoundUs = 50000;
// The same for the piece probe's round, which moves the 32 MiB probe once per way. Higher: one
// timed round across hosts picked a piece size whose steps were 1.7 times slower than the best.
constexpr double kSlowPieceRoundUs = 400000;
constexpr int64_t kNoHierarchy = int64_t{1} << 62;

// The ladder's tensors, mapped for one calibration only. From malloc, the 8 MiB freed after a
// process set calibrates (which may happen at any step) can stay resident in malloc's heap.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<float*>(p);
  }
  ~Scratch() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() const { return data_; }

 private:
  size_t bytes_;
  float* data_;
};

// What one rung moves in a round: the tensors alone and the fused bucket.
double RungBytes(const Rung& r) { return static_cast<double>((r.tensors + kAlone) * r.bytes_each); }

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(const std::vector<double>& values) {
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];
}

double Fastest(const std::vector<double>& values) {
  return *std::min_element(values.begin(), values.end());
}

// Times each of `ways` once per round, in turn, after one warm-up round; repeats kRepetitions
// rounds, or one when the slowest rank's warm-up round took longer than `slow_round_us`. Appends
// `summary` of each way's times (this rank's own) to *results.
Status TimeInTurns(const std::vector<std::function<Status()>>& ways, double slow_round_us,
                   double (*summary)(const std::vector<double>&), MPI_Comm comm,
                   std::vector<double>* results) {
  std::vector<std::vector<double>> runs(ways.size());
  int repetitions = kRepetitions;
  for (int rep = 0; rep <= repetitions; ++rep) {
    double round_us = 0;
    for (size_t w = 0; w < ways.size(); ++w) {
      GRADSYNC_MPI_CALL(MPI_Barrier(comm));
      const auto t0 = std::chrono::steady_clock::now();
      GRADSYNC_RETURN_IF_ERROR(ways[w]());
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      round_us += us;
      if (rep > 0) runs[w].push_back(us);  // the warm-up maps and touches what the rest reuse
    }
    if (rep == 0) {  // every rank must repeat as often: decided on the slowest warm-up
      double slowest = 0;
      GRADSYNC_MPI_CALL(MPI_Allreduce(&round_us, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm));
      if (slowest > slow_round_us) repetitions = 1;
    }
  }
  for (const std::vector<double>& way : runs) results->push_back(summary(way));
  return Status::OK();
}

// Every rank's calibration goes on only where every rank mapped its scratch memory: a rank that
// returned alone would leave the others in the first timed collective, and then run another
// sequence of collectives than theirs on the same communicator.
Status AgreeMapped(bool mapped, int64_t bytes, MPI_Comm comm) {
  int everywhere = mapped ? 1 : 0;
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, comm));
  if (everywhere != 0) return Status::OK();
  return Status::Internal("calibration could not map " + std::to_string(bytes) + " bytes" +
                          (mapped ? " on another rank" : ""));
}

}  // namespace

Status MpiDataPlane::CalibratePieces(std::vector<PieceSample>* out) {
  Scratch probe(static_cast<size_t>(kPieceProbeBytes));
  GRADSYNC_RETURN_IF_ERROR(AgreeMapped(probe.data() != nullptr, kPieceProbeBytes, comm_));
  const int64_t count = kPieceProbeBytes / static_cast<int64_t>(sizeof(float));
  std::fill(probe.data(), probe.data() + count, 0.0f);  // sums of zeros: no overflow, no denormals
  std::vector<int64_t> pieces = {0};
  pieces.insert(pieces.end(), std::begin(kPieceCandidates), std::end(kPieceCandidates));
  std::vector<std::function<Status()>> ways;
  for (const int64_t piece : pieces) {
    ways.push_back([&, piece] {
      return AllreduceInPieces(MPI_IN_PLACE, probe.data(), count, sizeof(float), MPI_FLOAT, MPI_SUM,
                               comm_, piece);
    });
  }
  // The fastest of the rounds: over TCP on shared cores a round now and then runs late for
  // reasons outside the collective, and one such round in a median of three picked piece sizes
  // that made steps 1.5 times slower than the best.
  std::vector<double> fastest;
  GRADSYNC_RETURN_IF_ERROR(TimeInTurns(ways, kSlowPieceRoundUs, Fastest, comm_, &fastest));
  // A rank sees its own time; the collective takes as long as the slowest rank's.
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, fastest.data(), static_cast<int>(fastest.size()),
                                  MPI_DOUBLE, MPI_MAX, comm_));
  out->clear();
  for (size_t i = 0; i < pieces.size(); ++i) out->push_back({pieces[i], fastest[i]});
  return Status::OK();
}

Status MpiDataPlane::Calibrate(bool compare_hierarchical, AllreduceCalibration* out,
                               double budget_seconds) {
  const auto start = std::chrono::steady_clock::now();
  bool hierarchical = false;
  if (compare_hierarchical) GRADSYNC_RETURN_IF_ERROR(hierarchical_.Applies(&hierarchical));
  int64_t most = 0;
  for (const Rung& r : kLadder) most = std::max(most, r.tensors * r.bytes_each);
  Scratch data(static_cast<size_t>(most));
  GRADSYNC_RETURN_IF_ERROR(AgreeMapped(data.data() != nullptr, most, comm_));
  std::fill(data.data(), data.data() + most / static_cast<int64_t>(sizeof(float)), 1.0f);
  std::vector<TensorEntry> entries(64);
  std::vector<TensorEntry*> members;
  const ReduceSpec sum{DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0};
  const int64_t from_bytes = hierarchical_from_bytes_;

  // The ways to time: alone, fused as the plane is set, and when comparing, fused flat and fused
  // hierarchical.
  std::vector<std::function<Status()>> ways = {
      [&] {
        // As the plane is set: comparing, the way timed before this one set it otherwise.
        hierarchical_from_bytes_ = from_bytes;
        for (int i = 0; i < kAlone; ++i) GRADSYNC_RETURN_IF_ERROR(Allreduce({members[i]}, sum));
        return Status::OK();
      },
      [&] { return Allreduce(members, sum); }};
  if (hierarchical) {
    ways[1] = [&] {
      hierarchical_from_bytes_ = kNoHierarchy;
      return Allreduce(members, sum);
    };
    ways.push_back([&] {
      hierarchical_from_bytes_ = 0;
      return Allreduce(members, sum);
    });
  }
  std::vector<double> medians;  // way by way, rung by rung

  Timeline* const timeline = timeline_;
  timeline_ = nullptr;  // calibration is not the application's work
  const auto time_rung = [&](const Rung& rung) -> Status {
    const int64_t count = rung.bytes_each / static_cast<int64_t>(sizeof(float));
    members.clear();
    for (int i = 0; i < rung.tensors; ++i) {
      TensorEntry& e = entries[i];
      e.name = "calibration";
      e.input = TensorView(data.data() + i * count, DataType::kFloat32, {count});
      e.output = e.input;
      members.push_back(&e);
    }
    return TimeInTurns(ways, kSlowRoundUs, Median, comm_, &medians);
  };
  Status status;
  size_t timed = 0;
  double last_rung_s = 0;
  double budget = budget_seconds;
  for (const Rung& rung : kLadder) {
    if (timed > 0) {
      // Every rank decides on the slowest rank's times and the smallest budget (the largest of
      // their negations), so all stop at the same size.
      double slowest[3] = {SecondsSince(start), last_rung_s, -budget_seconds};
      status = MpiResult(MPI_Allreduce(MPI_IN_PLACE, slowest, 3, MPI_DOUBLE, MPI_MAX, comm_),
                         "MPI_Allreduce (calibration budget)");
      if (!status.ok()) break;
      budget = -slowest[2];
      const double projected = slowest[1] * RungBytes(rung) / RungBytes(kLadder[timed - 1]);
      if (slowest[0] + projected > budget) break;
    }
    const auto rung_start = std::chrono::steady_clock::now();
    status = time_rung(rung);
    if (!status.ok()) break;
    last_rung_s = SecondsSince(rung_start);
    ++timed;
  }
  timeline_ = timeline;
  hierarchical_from_bytes_ = from_bytes;
  GRADSYNC_RETURN_IF_ERROR(status);

  // A rank sees its own time; the collective takes as long as the slowest rank's.
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, medians.data(), static_cast<int>(medians.size()),
                                  MPI_DOUBLE, MPI_MAX, comm_));
  out->in_place.clear();
  out->fused.clear();
  out->fused_hierarchical.clear();
  size_t i = 0;
  for (size_t k = 0; k < timed; ++k) {
    const Rung& r = kLadder[k];
    const double bytes = static_cast<double>(r.tensors * r.bytes_each);
    out->in_place.push_back({static_cast<double>(kAlone * r.bytes_each), kAlone, medians[i++]});
    out->fused.push_back({bytes, r.tensors, medians[i++]});
    if (hierarchical) out->fused_hierarchical.push_back({bytes, r.tensors, medians[i++]});
  }
  out->sizes_skipped = static_cast<int>(std::size(kLadder) - timed);
  out->seconds = SecondsSince(start);
  out->budget_seconds = budget;
  return Status::OK();
}

}  // namespace gradsync
