// Model gradient-set benchmark: how long one training step's gradient synchronization takes
// through gradsync, against raw MPI on the same bytes in the same process.
//
// For each set, every strategy reduces the same float32 tensors (SUM), interleaved round-robin so
// machine noise hits all of them alike:
//   gradsync    a gradsync::AllreduceBatch of the tensors in reverse registration order: each
//               started in that order (as backward produces them), then all waited for, as
//               gradsync.torch's DistributedOptimizer does
//   per-tensor  MPI_Allreduce in place on each tensor, same order
//   flat+copy   copy all tensors into one flat buffer, one MPI_Allreduce, copy back: what a
//               framework that fuses by hand pays
//   bucketed    the same in buckets of 25 MiB (PyTorch DDP's default) cut in backward order, one
//               after another
//   flat        the flat MPI_Allreduce alone: meant as a lower bound, printed for reference
//   gs-tensors  gradsync's per-tensor API: gradsync::allreduce() on each tensor in the same order,
//               then every handle waited for; printed for reference, on request only
//   chunk-S     flat+copy with the flat buffer reduced as consecutive MPI_Allreduce calls on
//               pieces of S bytes (1, 4, 16 and 64 MiB): over TCP a few large messages can beat
//               one huge one
//   pipe-S      pieces of S bytes (1, 4 and 16 MiB) in backward order, each copied in and started
//               with MPI_Iallreduce while up to three before it are in flight, and copied out once
//               done: copies and communication overlapped, as a hand-written pipeline does
// gradsync is judged against the best of every raw strategy but flat, per set, in the same run.
//
//   mpirun -np 4 gradsync_bench_models [--data-dir DIR] [--iters N] [--warmup N]
//                                       [--sets resnet50,bert_base,vgg16] [--strategies a,b]
#include <gradsync/gradsync.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "gradient_set.h"

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
// The columns follow this order; gradsync is first, and every strategy from per-tensor on but
// flat and gs-tensors is a raw one that "best" considers.
constexpr const char* kStrategyNames[] = {
    "gradsync", "per-tensor", "flat+copy", "bucketed", "flat",    "gs-tensors", "chunk-1M",
    "chunk-4M", "chunk-16M",  "chunk-64M", "pipe-1M",  "pipe-4M", "pipe-16M"};
constexpr const char* kColumnNames[] = {"gradsync_ms", "pertens_ms",  "flatcpy_ms", "bucket_ms",
                                        "flat_ms",     "gstens_ms",   "chunk1M_ms", "chunk4M_ms",
                                        "chunk16M_ms", "chunk64M_ms", "pipe1M_ms",  "pipe4M_ms",
                                        "pipe16M_ms"};
constexpr int kStrategyCount = 13;
constexpr int kGradsync = 0;
constexpr int kPerTensor = 1;
constexpr int kFlatCopy = 2;
constexpr int kBucketed = 3;
constexpr int kFlat = 4;
constexpr int kGsTensors = 5;
constexpr int kFirstChunk = 6;  // the chunk-S strategies, then the pipe-S ones
constexpr int64_t kMiB = int64_t{1} << 20;
// Piece sizes of the chunk-S and pipe-S strategies, by their order in kStrategyNames.
constexpr int64_t kChunkBytes[] = {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
constexpr int64_t kPipeBytes[] = {1 * kMiB, 4 * kMiB, 16 * kMiB};
// Pieces a pipe-S strategy keeps in flight besides the one it just started.
constexpr size_t kPipeDepth = 3;
// PyTorch DistributedDataParallel's default bucket_cap_mb.
constexpr int64_t kBucketBytes = int64_t{25} << 20;
constexpr int kSyntheticTensors = 1000;
constexpr int64_t kSyntheticElements = 256;
// A raw strategy gets a flat buffer of its own for a set of at most this size, and shares one
// with the others above it. Shared, a small set's buffer stays warm from one strategy's step to
// the next, which neither gradsync's staging buffer nor a trainer's own fusion buffer (used once
// between backward passes) enjoys; docs/benchmarks.md measures what that was worth. A set larger
// than any cache gains nothing from sharing, and eleven copies of it would not fit the memory.
constexpr int64_t kOwnFlatMaxBytes = 64 * kMiB;

// One gradient set's buffers and the ways to reduce them. The timed steps run on zeros once
// the result has been verified: sums of zeros stay exact however often they repeat, and the
// collectives cost the same whatever the values.
class SetBench {
 public:
  SetBench(const GradientSet& set, MPI_Comm comm);

  void Gradsync();
  void GradsyncTensors();
  void PerTensor();
  // The raw strategies reduce through `flat`, a buffer of the set's size.
  void FlatWithCopies(float* flat);
  void Bucketed(float* flat);
  void Flat(float* flat);
  void Chunked(int64_t piece_bytes, float* flat);
  void Pipelined(int64_t piece_bytes, float* flat);
  // Every strategy's step, by kStrategyNames' order.
  std::vector<std::function<void()>> Steps();

  // Runs each strategy once on fresh patterns and checks every element on every rank.
  bool VerifyAll();
  void Zero();

 private:
  void FillTensors();
  // Copies tensors [first, last] into their places in `flat`, reduces that span, copies back.
  void ReduceSpanWithCopies(size_t first, size_t last, float* flat);
  // Copies elements [begin, end) of the flat layout from the tensors into `flat` (`in`) or back.
  void CopyFlatRange(int64_t begin, int64_t end, bool in, float* flat);
  // Strategy `k`'s flat buffer: its own while the set is small enough for a cache to matter.
  float* FlatOf(int k);
  bool CheckTensors(const std::string& strategy) const;
  bool CheckFlat(const float* flat) const;

  std::vector<std::string> names_;
  std::vector<std::vector<float>> tensors_;
  std::vector<gradsync::TensorView> views_;
  std::vector<gradsync::AllreduceOptions> options_;
  std::vector<gradsync::Handle> handles_;
  std::unique_ptr<gradsync::AllreduceBatch> batch_;  // lists the tensors in backward order
  // By kStrategyNames' order; empty for gradsync's, per-tensor's and those that share flat_.
  std::vector<std::vector<float>> own_flats_;
  std::vector<float> flat_;
  std::vector<int64_t> offsets_;  // of each tensor in the flat layout
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

SetBench::SetBench(const GradientSet& set, MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  int64_t total = 0;
  for (const TensorSpec& spec : set.tensors) {
    names_.push_back(set.name + "/" + spec.name);
    tensors_.emplace_back(spec.num_elements());
    offsets_.push_back(total);
    total += spec.num_elements();
  }
  // Views and options are built once, outside the timed steps, as a framework's hooks would.
  for (size_t i = 0; i < tensors_.size(); ++i) {
    views_.emplace_back(tensors_[i].data(), gradsync::DataType::kFloat32,
                        std::vector<int64_t>{static_cast<int64_t>(tensors_[i].size())});
    gradsync::AllreduceOptions options;
    options.name = names_[i];
    options_.push_back(std::move(options));
  }
  handles_.reserve(tensors_.size());
  gradsync::AllreduceBatchOptions batch_options;
  std::vector<gradsync::TensorView> backward_order(views_.rbegin(), views_.rend());
  for (size_t i = names_.size(); i-- > 0;) batch_options.names.push_back("batch/" + names_[i]);
  batch_ = std::make_unique<gradsync::AllreduceBatch>(backward_order, batch_options);
  flat_.assign(total, 0.0f);
  own_flats_.resize(kStrategyCount);
  if (total * static_cast<int64_t>(sizeof(float)) <= kOwnFlatMaxBytes) {
    for (int k = 0; k < kStrategyCount; ++k) {
      if (k != kGradsync && k != kPerTensor && k != kGsTensors) own_flats_[k].assign(total, 0.0f);
    }
  }
}

float* SetBench::FlatOf(int k) {
  std::vector<float>& own = own_flats_[static_cast<size_t>(k)];
  return own.empty() ? flat_.data() : own.data();
}

// As a trainer's hooks do: each tensor started as backward produces it, the step's all waited for.
void SetBench::Gradsync() {
  const size_t n = tensors_.size();
  for (size_t k = 0; k < n; ++k) batch_->start(k, tensors_[n - 1 - k].data());
  batch_->wait();
}

// The per-tensor API: one handle per tensor.
void SetBench::GradsyncTensors() {
  handles_.clear();
  for (size_t i = views_.size(); i-- > 0;)
    handles_.push_back(gradsync::allreduce(views_[i], options_[i]));
  for (const gradsync::Handle& h : handles_) h.wait();
}

void SetBench::PerTensor() {
  for (size_t i = tensors_.size(); i-- > 0;) {
    AllreduceFloats(tensors_[i].data(), static_cast<int64_t>(tensors_[i].size()), comm_);
  }
}

void SetBench::FlatWithCopies(float* flat) { ReduceSpanWithCopies(0, tensors_.size() - 1, flat); }

void SetBench::Bucketed(float* flat) {
  // Backward order: a bucket is a run of indices ending where the previous one began, so its
  // tensors sit side by side in the flat layout.
  size_t last = tensors_.size() - 1;
  int64_t bytes = 0;
  for (size_t i = tensors_.size(); i-- > 0;) {
    bytes += static_cast<int64_t>(tensors_[i].size() * sizeof(float));
    if (bytes >= kBucketBytes || i == 0) {
      ReduceSpanWithCopies(i, last, flat);
      last = i - 1;
      bytes = 0;
    }
  }
}

void SetBench::ReduceSpanWithCopies(size_t first, size_t last, float* flat) {
  for (size_t i = last + 1; i-- > first;) {
    std::memcpy(flat + offsets_[i], tensors_[i].data(), tensors_[i].size() * sizeof(float));
  }
  const int64_t end = offsets_[last] + static_cast<int64_t>(tensors_[last].size());
  AllreduceFloats(flat + offsets_[first], end - offsets_[first], comm_);
  for (size_t i = last + 1; i-- > first;) {
    std::memcpy(tensors_[i].data(), flat + offsets_[i], tensors_[i].size() * sizeof(float));
  }
}

void SetBench::Flat(float* flat) {
  AllreduceFloats(flat, static_cast<int64_t>(flat_.size()), comm_);
}

void SetBench::CopyFlatRange(int64_t begin, int64_t end, bool in, float* flat) {
  // The last tensor that starts before `end`, then back to the one holding `begin`.
  size_t i = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), end - 1) -
                                 offsets_.begin());
  while (i-- > 0) {
    const int64_t first = std::max(begin, offsets_[i]);
    const int64_t last = std::min(end, offsets_[i] + static_cast<int64_t>(tensors_[i].size()));
    if (first < last) {
      float* piece = flat + first;
      float* tensor = tensors_[i].data() + (first - offsets_[i]);
      const size_t bytes = static_cast<size_t>(last - first) * sizeof(float);
      std::memcpy(in ? piece : tensor, in ? tensor : piece, bytes);
    }
    if (offsets_[i] <= begin) break;
  }
}

void SetBench::Chunked(int64_t piece_bytes, float* flat) {
  const auto total = static_cast<int64_t>(flat_.size());
  const int64_t piece = piece_bytes / static_cast<int64_t>(sizeof(float));
  CopyFlatRange(0, total, /*in=*/true, flat);
  for (int64_t end = total; end > 0; end -= piece) {
    const int64_t begin = std::max<int64_t>(0, end - piece);
    AllreduceFloats(flat + begin, end - begin, comm_);
  }
  CopyFlatRange(0, total, /*in=*/false, flat);
}

void SetBench::Pipelined(int64_t piece_bytes, float* flat) {
  struct InFlight {
    int64_t begin, end;
    MPI_Request request;
  };
  const int64_t piece = piece_bytes / static_cast<int64_t>(sizeof(float));
  std::deque<InFlight> in_flight;
  auto finish_oldest = [&] {
    InFlight& oldest = in_flight.front();
    MPI_Wait(&oldest.request, MPI_STATUS_IGNORE);
    CopyFlatRange(oldest.begin, oldest.end, /*in=*/false, flat);
    in_flight.pop_front();
  };
  for (int64_t end = static_cast<int64_t>(flat_.size()); end > 0; end -= piece) {
    const int64_t begin = std::max<int64_t>(0, end - piece);
    CopyFlatRange(begin, end, /*in=*/true, flat);
    in_flight.push_back({begin, end, MPI_REQUEST_NULL});
    MPI_Iallreduce(MPI_IN_PLACE, flat + begin, static_cast<int>(end - begin), MPI_FLOAT, MPI_SUM,
                   comm_, &in_flight.back().request);
    while (in_flight.size() > kPipeDepth) finish_oldest();
  }
  while (!in_flight.empty()) finish_oldest();
}

std::vector<std::function<void()>> SetBench::Steps() {
  std::vector<std::function<void()>> steps = {[this] { Gradsync(); },
                                              [this] { PerTensor(); },
                                              [this, f = FlatOf(kFlatCopy)] { FlatWithCopies(f); },
                                              [this, f = FlatOf(kBucketed)] { Bucketed(f); },
                                              [this, f = FlatOf(kFlat)] { Flat(f); },
                                              [this] { GradsyncTensors(); }};
  int k = kFirstChunk;
  for (int64_t bytes : kChunkBytes) {
    steps.push_back([this, bytes, f = FlatOf(k++)] { Chunked(bytes, f); });
  }
  for (int64_t bytes : kPipeBytes) {
    steps.push_back([this, bytes, f = FlatOf(k++)] { Pipelined(bytes, f); });
  }
  return steps;
}

void SetBench::FillTensors() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    FillPattern(tensors_[i].data(), static_cast<int64_t>(tensors_[i].size()), i, rank_);
  }
}

bool SetBench::CheckTensors(const std::string& strategy) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    int64_t bad = FirstMismatch(tensors_[i].data(), tensors_[i].size(), i, size_);
    if (bad < 0) continue;
    std::fprintf(stderr, "rank %d: %s result WRONG for '%s' element %lld: got %g, expected %g\n",
                 rank_, strategy.c_str(), names_[i].c_str(), static_cast<long long>(bad),
                 tensors_[i][bad], ExpectedSum(bad, i, size_));
    return false;
  }
  return true;
}

bool SetBench::CheckFlat(const float* flat) const {
  int64_t bad = FirstMismatch(flat, flat_.size(), 0, size_);
  if (bad >= 0) {
    std::fprintf(stderr, "rank %d: flat result WRONG at element %lld: got %g, expected %g\n", rank_,
                 static_cast<long long>(bad), flat[bad], ExpectedSum(bad, 0, size_));
  }
  return bad < 0;
}

bool SetBench::VerifyAll() {
  bool ok = true;
  const std::vector<std::function<void()>> steps = Steps();
  for (int k = 0; k < kStrategyCount; ++k) {
    if (k == kFlat) continue;  // reduces its flat buffer alone: checked below
    FillTensors();
    steps[k]();
    ok = CheckTensors(kStrategyNames[k]) && ok;
  }
  float* flat = FlatOf(kFlat);
  FillPattern(flat, static_cast<int64_t>(flat_.size()), 0, rank_);
  Flat(flat);
  ok = CheckFlat(flat) && ok;
  return AllRanksOk(ok, comm_);
}

void SetBench::Zero() {
  for (auto& t : tensors_) std::fill(t.begin(), t.end(), 0.0f);
  std::fill(flat_.begin(), flat_.end(), 0.0f);
  for (auto& own : own_flats_) std::fill(own.begin(), own.end(), 0.0f);
}

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
