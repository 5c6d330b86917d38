#include "bench_common.h"

#include <gradsync/gradsync.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <random>
#include <stdexcept>

namespace gradsync_bench {

void StartUp(int* argc, char*** argv) {
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    throw std::runtime_error("MPI_Init_thread failed");
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    throw std::runtime_error(
        "MPI provides no MPI_THREAD_MULTIPLE; gradsync's background thread "
        "and the raw MPI baselines would call MPI concurrently");
  }
  gradsync::init(MPI_COMM_WORLD);
}

void TearDown() {
  gradsync::shutdown();
  MPI_Finalize();
}

Flags::Flags(int argc, char** argv, const std::vector<std::string>& known) {
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i];
    if (std::find(known.begin(), known.end(), flag) == known.end()) {
      throw std::invalid_argument("unknown flag '" + flag + "'");
    }
    if (i + 1 >= argc) throw std::invalid_argument("flag '" + flag + "' needs a value");
    values_[flag] = argv[i + 1];
  }
}

std::string Flags::Get(const std::string& flag, const std::string& fallback) const {
  auto it = values_.find(flag);
  return it == values_.end() ? fallback : it->second;
}

int64_t Flags::GetInt(const std::string& flag, int64_t fallback, int64_t min) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (end == it->second.c_str() || *end != '\0' || v < min) {
    throw std::invalid_argument(flag + " needs an integer >= " + std::to_string(min) + ", got '" +
                                it->second + "'");
  }
  return v;
}

// Values stay below 16 per rank, so sums are exact in float32 for any realistic rank count.
void FillPattern(float* data, int64_t count, int64_t salt, int rank) {
  for (int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(1 + rank % 8 + (i + salt) % 7);
}

float ExpectedSum(int64_t i, int64_t salt, int size) {
  int64_t sum = 0;
  for (int r = 0; r < size; ++r) sum += 1 + r % 8 + (i + salt) % 7;
  return static_cast<float>(sum);
}

int64_t FirstMismatch(const float* data, int64_t count, int64_t salt, int size) {
  // The expected value depends on i only through (i + salt) % 7: compute the seven once.
  float expected[7];
  for (int k = 0; k < 7; ++k) expected[k] = ExpectedSum(k, 0, size);
  for (int64_t i = 0; i < count; ++i) {
    if (data[i] != expected[(i + salt) % 7]) return i;
  }
  return -1;
}

bool AllRanksOk(bool ok, MPI_Comm comm) {
  int local = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, comm);
  return all == 1;
}

void AllreduceFloats(float* data, int64_t count, MPI_Comm comm) {
  if (count > INT_MAX) throw std::runtime_error("MPI_Allreduce count exceeds INT_MAX");
  int rc = MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm);
  if (rc != MPI_SUCCESS)
    throw std::runtime_error("MPI_Allreduce failed with code " + std::to_string(rc));
}

namespace {

double TimeOneStep(const std::function<void()>& step, MPI_Comm comm) {
  MPI_Barrier(comm);
  double start = MPI_Wtime();
  step();
  double local = MPI_Wtime() - start, slowest = 0.0;
  MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}

}  // namespace

std::vector<double> MeasureInterleaved(const std::vector<Strategy>& strategies, int warmup,
                                       int iters, MPI_Comm comm) {
  const size_t n = strategies.size();
  std::vector<std::vector<double>> times(n);
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = k;
  // std::shuffle's result is implementation-defined but the same for the same generator state, and
  // every rank runs this same binary.
  std::mt19937 generator(20261127);
  for (int round = 0; round < warmup + iters; ++round) {
    std::shuffle(order.begin(), order.end(), generator);
    for (size_t s : order) {
      double t = TimeOneStep(strategies[s].step, comm);
      if (round >= warmup) times[s].push_back(t);
    }
  }
  std::vector<double> medians;
  for (auto& t : times) medians.push_back(Median(t));
  return medians;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

int RunBenchmark(const char* program, int (*run)(int, char**), int argc, char** argv) {
  try {
    StartUp(&argc, &argv);
    const int status = run(argc, argv);
    TearDown();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace gradsync_bench
