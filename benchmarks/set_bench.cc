#include "set_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>

#include "bench_common.h"

namespace gradsync_bench {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// Piece sizes of the chunk-S and pipe-S strategies, by their order in kStrategyNames.
constexpr int64_t kChunkBytes[] = {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
constexpr int64_t kPipeBytes[] = {1 * kMiB, 4 * kMiB, 16 * kMiB};
// Pieces a pipe-S strategy keeps in flight besides the one it just started.
constexpr size_t kPipeDepth = 3;
// Floats a pipe-S strategy copies between two tests of its pieces in flight (256 KiB).
constexpr int64_t kPipeCopySlice = 64 << 10;
// PyTorch DistributedDataParallel's default bucket_cap_mb.
constexpr int64_t kBucketBytes = int64_t{25} << 20;
// A raw strategy gets a flat buffer of its own for a set of at most this size, and shares one
// with the others above it. Shared, a small set's buffer stays warm from one strategy's step to
// the next, which neither gradsync's staging buffer nor a trainer's own fusion buffer (used once
// between backward passes) enjoys; docs/benchmarks.md measures what that was worth. A set larger
// than any cache gains nothing from sharing, and eleven copies of it would not fit the memory.
constexpr int64_t kOwnFlatMaxBytes = 64 * kMiB;

}  // namespace

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
  // MPI advances a non-blocking collective only inside MPI calls: the copies go in slices with a
  // test of every piece in flight between them, as gradsync's own pipeline does, so that the
  // copies overlap the reductions instead of running before them.
  const auto copy = [&](int64_t begin, int64_t end, bool in) {
    for (int64_t at = begin; at < end; at += kPipeCopySlice) {
      CopyFlatRange(at, std::min(end, at + kPipeCopySlice), in, flat);
      for (InFlight& piece_in_flight : in_flight) {
        int done = 0;
        MPI_Test(&piece_in_flight.request, &done, MPI_STATUS_IGNORE);
      }
    }
  };
  auto finish_oldest = [&] {
    InFlight oldest = in_flight.front();
    in_flight.pop_front();
    MPI_Wait(&oldest.request, MPI_STATUS_IGNORE);
    copy(oldest.begin, oldest.end, /*in=*/false);
  };
  for (int64_t end = static_cast<int64_t>(flat_.size()); end > 0; end -= piece) {
    const int64_t begin = std::max<int64_t>(0, end - piece);
    copy(begin, end, /*in=*/true);
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
}  // namespace gradsync_bench
