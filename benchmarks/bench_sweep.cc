// Allreduce size sweep: one float32 tensor, SUM, from 8 B up to 256 MB, gradsync (enqueue + wait)
// against MPI_Allreduce in place on the same buffer, interleaved in one process. Bandwidths follow
// nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes.
//
//   mpirun -np 4 gradsync_bench_sweep [--min-bytes B] [--max-bytes B] [--factor F] [--iters N]
//                                      [--warmup N]
#include <gradsync/gradsync.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"

namespace gradsync_bench {
namespace {

constexpr const char* kUsage =
    "usage: gradsync_bench_sweep [--min-bytes B] [--max-bytes B] [--factor F] [--iters N] "
    "[--warmup N]\n"
    "  sizes run from --min-bytes (default 8) to --max-bytes (default 268435456) in steps of\n"
    "  --factor (default 2); --iters caps the timed iterations per size (default 100)\n";
// Large sizes get fewer iterations: about this many bytes per strategy and size, at least
// kMinIters.
constexpr int64_t kBytesPerSize = int64_t{512} << 20;
constexpr int kMinIters = 5;

struct Config {
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{256} << 20;
  int64_t factor = 2;
  int iters = 100;
  int warmup = 3;
};

Config ParseConfig(int argc, char** argv) {
  Flags flags(argc, argv, {"--min-bytes", "--max-bytes", "--factor", "--iters", "--warmup"});
  Config c;
  c.min_bytes = flags.GetInt("--min-bytes", c.min_bytes, 4);
  c.max_bytes = flags.GetInt("--max-bytes", c.max_bytes, c.min_bytes);
  c.factor = flags.GetInt("--factor", c.factor, 2);
  c.iters = static_cast<int>(flags.GetInt("--iters", c.iters, 1));
  c.warmup = static_cast<int>(flags.GetInt("--warmup", c.warmup, 0));
  if (c.min_bytes % 4 != 0)
    throw std::invalid_argument("--min-bytes must be a multiple of 4 (float32)");
  return c;
}

// One buffer of `bytes` and the two ways to reduce it. Timed steps run on zeros after the result
// has been verified, so repeated in-place sums stay exact.
class SizeBench {
 public:
  SizeBench(int64_t bytes, MPI_Comm comm)
      : data_(bytes / 4, 0.0f),
        view_(data_.data(), gradsync::DataType::kFloat32, {static_cast<int64_t>(data_.size())}),
        comm_(comm) {
    options_.name = "sweep." + std::to_string(bytes);
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }

  void Gradsync() { gradsync::allreduce(view_, options_).wait(); }
  void Mpi() { AllreduceFloats(data_.data(), static_cast<int64_t>(data_.size()), comm_); }

  bool VerifyBoth() {
    bool ok = RunChecked("gradsync", [this] { Gradsync(); });
    ok = RunChecked("MPI_Allreduce", [this] { Mpi(); }) && ok;
    std::fill(data_.begin(), data_.end(), 0.0f);
    return AllRanksOk(ok, comm_);
  }

 private:
  template <typename Step>
  bool RunChecked(const char* what, Step step) {
    const int64_t n = static_cast<int64_t>(data_.size());
    FillPattern(data_.data(), n, 0, rank_);
    step();
    int64_t bad = FirstMismatch(data_.data(), n, 0, size_);
    if (bad < 0) return true;
    std::fprintf(stderr, "rank %d: %s result WRONG for %s element %lld: got %g, expected %g\n",
                 rank_, what, options_.name.c_str(), static_cast<long long>(bad), data_[bad],
                 ExpectedSum(bad, 0, size_));
    return false;
  }

  std::vector<float> data_;
  gradsync::TensorView view_;
  gradsync::AllreduceOptions options_;
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

int IterationsFor(int64_t bytes, int max_iters) {
  int64_t n = std::max<int64_t>(kMinIters, kBytesPerSize / bytes);
  return static_cast<int>(std::min<int64_t>(n, max_iters));
}

void PrintHeader(const Config& c, int size) {
  std::printf(
      "# gradsync_bench_sweep: %d ranks, float32 SUM, one tensor, median of up to %d "
      "iterations (+%d warmup) per size, interleaved; a step's time is the slowest rank's\n",
      size, c.iters, c.warmup);
  std::printf("# algbw = bytes/time, busbw = algbw*2(n-1)/n, GB = 1e9 bytes\n");
  std::printf("%12s %6s | %11s %9s %9s | %11s %9s %9s | %7s\n", "bytes", "iters", "gs_us",
              "gs_algbw", "gs_busbw", "mpi_us", "mpi_algbw", "mpi_busbw", "gs/mpi");
}

void PrintRow(int64_t bytes, int iters, double gs, double mpi, int size) {
  const double bus = size > 1 ? 2.0 * (size - 1) / size : 0.0;
  const double gs_alg = bytes / gs / 1e9, mpi_alg = bytes / mpi / 1e9;
  std::printf("%12lld %6d | %11.1f %9.3f %9.3f | %11.1f %9.3f %9.3f | %7.2f\n",
              static_cast<long long>(bytes), iters, gs * 1e6, gs_alg, gs_alg * bus, mpi * 1e6,
              mpi_alg, mpi_alg * bus, gs / mpi);
  std::fflush(stdout);
}

bool BenchSize(int64_t bytes, const Config& c, MPI_Comm comm, int rank, int size) {
  SizeBench bench(bytes, comm);
  if (!bench.VerifyBoth()) return false;
  const int iters = IterationsFor(bytes, c.iters);
  std::vector<Strategy> strategies = {{"gradsync", [&] { bench.Gradsync(); }},
                                      {"MPI_Allreduce", [&] { bench.Mpi(); }}};
  std::vector<double> t = MeasureInterleaved(strategies, std::min(c.warmup, iters), iters, comm);
  if (rank == 0) PrintRow(bytes, iters, t[0], t[1], size);
  return true;
}

int Run(int argc, char** argv) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Config c;
  try {
    c = ParseConfig(argc, argv);
  } catch (const std::invalid_argument& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n%s", e.what(), kUsage);
    return 2;
  }
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rank == 0) PrintHeader(c, size);
  bool ok = true;
  for (int64_t bytes = c.min_bytes; ok && bytes <= c.max_bytes; bytes *= c.factor) {
    ok = BenchSize(bytes, c, comm, rank, size);
  }
  if (!ok && rank == 0) std::fprintf(stderr, "error: wrong allreduce results, see above\n");
  MPI_Comm_free(&comm);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace gradsync_bench

int main(int argc, char** argv) {
  return gradsync_bench::RunBenchmark("gradsync_bench_sweep", gradsync_bench::Run, argc, argv);
}
