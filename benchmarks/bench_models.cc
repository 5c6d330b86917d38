// Model gradient-set benchmark: how long one training step's gradient synchronization takes
// through gradsync, against raw MPI on the same bytes in the same process.
//
// Every strategy (set_bench.h) runs interleaved in a shuffled order each round, so that machine
// noise hits all of them alike; gradsync is judged against the best of every raw strategy but
// flat, per set, in the same run.
//
//   mpirun -np 4 gradsync_bench_models [--data-dir DIR] [--iters N] [--warmup N]
//                                       [--sets resnet50,bert_base,vgg16] [--strategies a,b]
#include <gradsync/gradsync.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "gradient_set.h"
#include "set_bench.h"

namespace gradsync_bench {
namespace {

constexpr const char* kUsage =
    "usage: gradsync_bench_models [--data-dir DIR] [--iters N] [--warmup N] [--sets a,b,c]\n"
    "                             [--strategies a,b]\n"
    "  --data-dir    gradient-set folder (default: $GRADSYNC_DATA_DIR, else ../shared/data)\n"
    "  --sets        comma-separated file stems (default: resnet50,bert_base,vgg16)\n"
    "  --strategies  comma-separated subset of gradsync,per-tensor,flat+copy,bucketed,flat,\n"
    "                gs-tensors,chunk-1M,chunk-4M,chunk-16M,chunk-64M,pipe-1M,pipe-4M,pipe-16M\n"
    "                (default: all but gs-tensors; columns of the others print as -)\n";
constexpr const char* kDefaultSets = "resnet50,bert_base,vgg16";
constexpr const char* kColumnNames[] = {"gradsync_ms", "pertens_ms",  "flatcpy_ms", "bucket_ms",
                                        "flat_ms",     "gstens_ms",   "chunk1M_ms", "chunk4M_ms",
                                        "chunk16M_ms", "chunk64M_ms", "pipe1M_ms",  "pipe4M_ms",
                                        "pipe16M_ms"};
constexpr int kSyntheticTensors = 1000;
constexpr int64_t kSyntheticElements = 256;

struct Config {
  std::string data_dir;
  std::vector<std::string> sets;
  int iters = 10;
  int warmup = 2;
  // gs-tensors only on request: its 1000 names beside the others' fill the response cache.
  bool run[kStrategyCount] = {true, true, true, true, true, false, true,
                              true, true, true, true, true, true};  // by kStrategyNames' order
};

Config ParseConfig(int argc, char** argv) {
  Flags flags(argc, argv, {"--data-dir", "--iters", "--warmup", "--sets", "--strategies"});
  Config config;
  const char* env_dir = std::getenv("GRADSYNC_DATA_DIR");
  config.data_dir = flags.Get("--data-dir", env_dir && *env_dir ? env_dir : "../shared/data");
  config.iters = static_cast<int>(flags.GetInt("--iters", config.iters, 1));
  config.warmup = static_cast<int>(flags.GetInt("--warmup", config.warmup, 0));
  std::istringstream sets(flags.Get("--sets", kDefaultSets));
  for (std::string s; std::getline(sets, s, ',');) {
    if (!s.empty()) config.sets.push_back(s);
  }
  if (flags.Get("--strategies", "").empty()) return config;
  std::fill(std::begin(config.run), std::end(config.run), false);
  std::istringstream strategies(flags.Get("--strategies", ""));
  for (std::string s; std::getline(strategies, s, ',');) {
    const auto* found = std::find(std::begin(kStrategyNames), std::end(kStrategyNames), s);
    if (found == std::end(kStrategyNames)) {
      throw std::invalid_argument("unknown strategy '" + s + "'");
    }
    config.run[found - std::begin(kStrategyNames)] = true;
  }
  if (std::none_of(std::begin(config.run), std::end(config.run), [](bool r) { return r; })) {
    throw std::invalid_argument("--strategies names none");
  }
  return config;
}

GradientSet SyntheticSet() {
  GradientSet set;
  set.name = "1000x1KB";
  for (int i = 0; i < kSyntheticTensors; ++i) {
    set.tensors.push_back(
        {"t" + std::to_string(i), gradsync::DataType::kFloat32, {kSyntheticElements}});
  }
  return set;
}

// Every rank reads the files; if any cannot, all stop. Rank 0 reports, or the rank that failed
// when rank 0 did not, so a shared bad file is reported once.
bool LoadSets(const Config& config, int rank, std::vector<GradientSet>* sets) {
  std::string error;
  try {
    for (const std::string& name : config.sets) {
      sets->push_back(LoadGradientSet(config.data_dir + "/" + name + ".txt"));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  int root_ok = error.empty() ? 1 : 0;
  MPI_Bcast(&root_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!error.empty() && (rank == 0 || root_ok)) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, error.c_str());
  }
  return AllRanksOk(error.empty(), MPI_COMM_WORLD);
}

// The benchmark allocates float32 whatever the file says, like the README's "fp32 bytes".
double Megabytes(const GradientSet& set) {
  int64_t elements = 0;
  for (const TensorSpec& t : set.tensors) elements += t.num_elements();
  return 4e-6 * static_cast<double>(elements);
}

void PrintHeader(const Config& config, int size) {
  std::printf(
      "# gradsync_bench_models: %d ranks, float32 SUM, median of %d iterations (+%d warmup) "
      "per strategy, interleaved; a step's time is the slowest rank's\n",
      size, config.iters, config.warmup);
  std::printf("%-10s %7s %8s", "set", "tensors", "MB");
  for (const char* column : kColumnNames) std::printf(" %11s", column);
  std::printf(" %9s %8s %8s %8s\n", "best_raw", "gs/best", "pt/gs", "gs/flat");
}

// `t` holds seconds by kStrategyNames' order, NaN for a strategy that did not run; a column or
// ratio that needs one prints as "-".
void PrintRow(const GradientSet& set, const std::vector<double>& t) {
  auto cell = [](double value, int width, int digits) {
    char text[32];
    if (std::isnan(value)) {
      std::snprintf(text, sizeof(text), "%*s", width, "-");
    } else {
      std::snprintf(text, sizeof(text), "%*.*f", width, digits, value);
    }
    return std::string(text);
  };
  auto ms = [&](double seconds) { return cell(seconds * 1e3, 11, 3); };
  auto ratio = [&](double r) { return cell(r, 8, 2); };
  const double gs = t[0], pt = t[1], flat = t[kFlat];
  // The best raw strategy among those that ran (NaN for those that did not).
  double best = std::nan("");
  const char* best_name = "-";
  for (int k = 1; k < kStrategyCount; ++k) {
    if (k == kFlat || k == kGsTensors || std::isnan(t[k])) continue;
    if (std::isnan(best) || t[k] < best) {
      best = t[k];
      best_name = kStrategyNames[k];
    }
  }
  std::printf("%-10s %7zu %8.1f", set.name.c_str(), set.tensors.size(), Megabytes(set));
  for (double seconds : t) std::printf(" %s", ms(seconds).c_str());
  std::printf(" %9s %s %s %s\n", best_name, ratio(gs / best).c_str(), ratio(pt / gs).c_str(),
              ratio(gs / flat).c_str());
  std::fflush(stdout);
}

// False if any strategy produced a wrong sum on any rank.
bool BenchSet(const GradientSet& set, const Config& config, MPI_Comm comm, int rank) {
  SetBench bench(set, comm);
  if (!bench.VerifyAll()) {
    if (rank == 0) std::fprintf(stderr, "error: wrong results for set %s\n", set.name.c_str());
    return false;
  }
  bench.Zero();
  const std::vector<std::function<void()>> steps = bench.Steps();
  std::vector<Strategy> strategies;
  for (int k = 0; k < kStrategyCount; ++k) {
    if (config.run[k]) strategies.push_back({kStrategyNames[k], steps[k]});
  }
  const std::vector<double> medians =
      MeasureInterleaved(strategies, config.warmup, config.iters, comm);
  std::vector<double> by_strategy(kStrategyCount, std::nan(""));
  for (int k = 0, m = 0; k < kStrategyCount; ++k) {
    if (config.run[k]) by_strategy[k] = medians[m++];
  }
  if (rank == 0) PrintRow(set, by_strategy);
  return true;
}

int Run(int argc, char** argv) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Config config;
  try {
    config = ParseConfig(argc, argv);
  } catch (const std::invalid_argument& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n%s", e.what(), kUsage);
    return 2;
  }
  std::vector<GradientSet> sets;
  if (!LoadSets(config, rank, &sets)) return 1;
  sets.push_back(SyntheticSet());
  // The raw baselines get their own communicator, as gradsync has its own.
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rank == 0) PrintHeader(config, size);
  bool ok = true;
  for (const GradientSet& set : sets) ok = ok && BenchSet(set, config, comm, rank);
  MPI_Comm_free(&comm);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace gradsync_bench

int main(int argc, char** argv) {
  return gradsync_bench::RunBenchmark("gradsync_bench_models", gradsync_bench::Run, argc, argv);
}
