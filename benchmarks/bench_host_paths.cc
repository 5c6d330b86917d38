// The host allreduce paths of the MPI data plane, side by side in one run: MPI's own allreduce on
// one contiguous buffer (no copies), the plane through MPI messages (copy in, MPI_Allreduce, copy
// out), the same pipelined in 4 MiB chunks (copies overlapping the reductions, from two chunks
// up), the plane through node shared memory (when every rank shares the node), and the
// hierarchical allreduce (when the ranks form several hosts of the same size). Each bucket is
// `--tensors` float32 tensors totalling the row's bytes, as a fused gradient bucket is.
//
// With --piece-bytes, MPI's own allreduce and the plane's go in pieces of that size (as after a
// calibration that chose it), and one more raw column, `whole_pass`, does the plane's work with
// each copy and scale as a pass of its own over the whole bucket: copy in, the allreduce in
// pieces, copy out (scaling by 1/ranks with --average). The plane does the same work piece by
// piece; `pmpi/whole` is what that saves.
//
//   mpirun -np 8 gradsync_bench_host_paths [--min-bytes B] [--max-bytes B] [--factor F]
//                                          [--tensors T] [--iters N] [--warmup N]
//                                          [--piece-bytes B] [--average 0|1]
//
// Columns are median microseconds (the slowest rank's, interleaved round-robin) and each path's
// time over MPI's own; "-" where a path does not apply to this layout.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "ops/mpi/hierarchical_allreduce.h"
#include "ops/mpi/mpi_data_plane.h"
#include "ops/mpi/mpi_types.h"

namespace gradsync_bench {
namespace {

using gradsync::DataType;
using gradsync::MpiDataPlane;
using gradsync::TensorEntry;

constexpr int64_t kUnlimitedShm = int64_t{1} << 34;
constexpr int64_t kBytesPerSize = int64_t{256} << 20;
constexpr int kMinIters = 5;
constexpr int64_t kPipelineChunk = int64_t{4} << 20;

struct Config {
  int64_t min_bytes = 4096;
  int64_t max_bytes = int64_t{64} << 20;
  int64_t factor = 4;
  int tensors = 8;
  int iters = 50;
  int warmup = 3;
  int64_t piece_bytes = 0;
  bool average = false;
};

// One plane, on its own communicator, and the bucket it reduces.
class PlaneBench {
 public:
  PlaneBench(int64_t shm_threshold, bool hierarchical, const std::vector<int64_t>& counts,
             const Config& config, int64_t pipeline_chunk = 0) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    plane_ = std::make_unique<MpiDataPlane>(comm_, nullptr, shm_threshold, hierarchical);
    plane_->set_pipeline_chunk_bytes(pipeline_chunk);
    plane_->set_piece_bytes(config.piece_bytes);
    if (config.average) spec_.op = gradsync::ReduceOp::kAverage;
    for (int64_t count : counts) {
      tensors_.emplace_back(count, 0.0f);
      auto entry = std::make_unique<TensorEntry>();
      entry->name = "bucket." + std::to_string(entries_.size());
      entry->input = gradsync::TensorView(tensors_.back().data(), DataType::kFloat32, {count});
      entry->output = entry->input;
      entries_.push_back(entry.get());
      owned_.push_back(std::move(entry));
    }
  }
  ~PlaneBench() {
    plane_.reset();
    MPI_Comm_free(&comm_);
  }

  void Step() { Reduce(spec_); }

  // One sum on patterns, checked on every rank, then zeros for the timed steps.
  bool Verify(int rank, int size) {
    for (size_t t = 0; t < tensors_.size(); ++t) {
      FillPattern(tensors_[t].data(), static_cast<int64_t>(tensors_[t].size()), t, rank);
    }
    Reduce(gradsync::ReduceSpec{});
    bool ok = true;
    for (size_t t = 0; t < tensors_.size(); ++t) {
      ok = ok &&
           FirstMismatch(tensors_[t].data(), static_cast<int64_t>(tensors_[t].size()), t, size) < 0;
      std::fill(tensors_[t].begin(), tensors_[t].end(), 0.0f);
    }
    return ok;
  }

 private:
  void Reduce(const gradsync::ReduceSpec& spec) {
    const gradsync::Status status = plane_->Allreduce(entries_, spec);
    if (!status.ok()) throw std::runtime_error(status.ToString());
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  gradsync::ReduceSpec spec_;
  std::unique_ptr<MpiDataPlane> plane_;
  std::vector<std::vector<float>> tensors_;
  std::vector<std::unique_ptr<TensorEntry>> owned_;
  std::vector<TensorEntry*> entries_;
};

// Whether every rank shares one node, and whether the ranks form several hosts of equal size.
struct Layout {
  bool one_node = false;
  bool hierarchical = false;
  int hosts = 1;
};

Layout DescribeLayout() {
  Layout layout;
  int size = 1, node_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  layout.one_node = node_size == size;
  gradsync::HierarchicalAllreduce probe(MPI_COMM_WORLD, true, 0);
  probe.Applies(&layout.hierarchical);
  layout.hosts = size / std::max(1, node_size);
  return layout;
}

std::vector<int64_t> TensorCounts(int64_t bytes, int tensors) {
  const int64_t total = bytes / 4;
  std::vector<int64_t> counts;
  for (int t = 0; t < tensors; ++t)
    counts.push_back(total * (t + 1) / tensors - total * t / tensors);
  return counts;
}

// MPI's own allreduce of `count` floats in place, in pieces of `piece_bytes` (0: whole).
void AllreduceRaw(float* data, int64_t count, int64_t piece_bytes) {
  const gradsync::Status status = gradsync::AllreduceInPieces(
      MPI_IN_PLACE, data, count, sizeof(float), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, piece_bytes);
  if (!status.ok()) throw std::runtime_error(status.ToString());
}

// The plane's work as passes over the whole bucket: `tensors` copied into `contiguous`, reduced
// in pieces, copied back times `scale`. One tensor is reduced in place, then scaled in a pass.
void WholePasses(std::vector<std::vector<float>>* tensors, std::vector<float>* contiguous,
                 int64_t piece_bytes, float scale) {
  if (tensors->size() == 1) {
    std::vector<float>& only = tensors->front();
    AllreduceRaw(only.data(), static_cast<int64_t>(only.size()), piece_bytes);
    if (scale != 1.0f) {
      for (float& x : only) x *= scale;
    }
    return;
  }
  size_t at = 0;
  for (const std::vector<float>& t : *tensors) {
    std::copy(t.begin(), t.end(), contiguous->begin() + static_cast<std::ptrdiff_t>(at));
    at += t.size();
  }
  AllreduceRaw(contiguous->data(), static_cast<int64_t>(at), piece_bytes);
  at = 0;
  for (std::vector<float>& t : *tensors) {
    for (float& x : t) x = (*contiguous)[at++] * scale;
  }
}

int Run(int argc, char** argv) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Config c;
  Flags flags(argc, argv,
              {"--min-bytes", "--max-bytes", "--factor", "--tensors", "--iters", "--warmup",
               "--piece-bytes", "--average"});
  c.min_bytes = flags.GetInt("--min-bytes", c.min_bytes, 64);
  c.max_bytes = flags.GetInt("--max-bytes", c.max_bytes, c.min_bytes);
  c.factor = flags.GetInt("--factor", c.factor, 2);
  c.tensors = static_cast<int>(flags.GetInt("--tensors", c.tensors, 1));
  c.iters = static_cast<int>(flags.GetInt("--iters", c.iters, 1));
  c.warmup = static_cast<int>(flags.GetInt("--warmup", c.warmup, 0));
  c.piece_bytes = flags.GetInt("--piece-bytes", c.piece_bytes, 0);
  c.average = flags.GetInt("--average", 0, 0) != 0;
  const Layout layout = DescribeLayout();
  if (rank == 0) {
    std::printf(
        "# gradsync_bench_host_paths: %d ranks on %d host(s), float32 %s, buckets of %d "
        "tensors, MPI allreduces %s, median us of up to %d iterations (+%d warmup), "
        "interleaved\n",
        size, layout.hosts, c.average ? "AVERAGE" : "SUM", c.tensors,
        c.piece_bytes > 0 ? ("in pieces of " + std::to_string(c.piece_bytes) + " bytes").c_str()
                          : "whole",
        c.iters, c.warmup);
    std::printf("%12s | %10s %10s %10s %10s %10s %10s | %8s %8s %8s %8s %10s\n", "bytes", "mpi_own",
                "plane_mpi", "whole_pass", "pipelined", "plane_shm", "hier", "pmpi/own", "pipe/own",
                "shm/own", "hier/own", "pmpi/whole");
  }
  const float scale = c.average ? 1.0f / static_cast<float>(size) : 1.0f;
  bool ok = true;
  for (int64_t bytes = c.min_bytes; ok && bytes <= c.max_bytes; bytes *= c.factor) {
    const std::vector<int64_t> counts = TensorCounts(bytes, c.tensors);
    std::vector<float> contiguous(static_cast<size_t>(bytes / 4), 0.0f);
    std::vector<std::vector<float>> loose;
    for (int64_t count : counts) loose.emplace_back(count, 0.0f);
    PlaneBench messages(0, false, counts, c);
    PlaneBench pipelined(0, false, counts, c, kPipelineChunk);
    std::unique_ptr<PlaneBench> shared, hierarchical;
    if (layout.one_node && size > 1)
      shared = std::make_unique<PlaneBench>(kUnlimitedShm, false, counts, c);
    if (layout.hierarchical) {
      hierarchical = std::make_unique<PlaneBench>(kUnlimitedShm, true, counts, c);
    }
    std::vector<Strategy> strategies = {
        {"mpi_own", [&] { AllreduceRaw(contiguous.data(), bytes / 4, c.piece_bytes); }},
        {"plane_mpi", [&] { messages.Step(); }},
        {"whole_pass", [&] { WholePasses(&loose, &contiguous, c.piece_bytes, scale); }},
        {"pipelined", [&] { pipelined.Step(); }}};
    ok = messages.Verify(rank, size) && pipelined.Verify(rank, size);
    if (shared) {
      ok = shared->Verify(rank, size) && ok;
      strategies.push_back({"plane_shm", [&] { shared->Step(); }});
    }
    if (hierarchical) {
      ok = hierarchical->Verify(rank, size) && ok;
      strategies.push_back({"hier", [&] { hierarchical->Step(); }});
    }
    ok = AllRanksOk(ok, MPI_COMM_WORLD);
    if (!ok) break;
    const int iters = static_cast<int>(
        std::min<int64_t>(c.iters, std::max<int64_t>(kMinIters, kBytesPerSize / bytes)));
    const std::vector<double> t =
        MeasureInterleaved(strategies, std::min(c.warmup, iters), iters, MPI_COMM_WORLD);
    if (rank != 0) continue;
    const double own = t[0];
    const double shm = shared ? t[4] : 0.0;
    const double hier = hierarchical ? t.back() : 0.0;
    auto us = [](double s, bool present) {
      return present ? std::to_string(static_cast<long long>(s * 1e6 + 0.5)) : std::string("-");
    };
    auto ratio = [&](double s, double over, bool present) {
      char text[16];
      std::snprintf(text, sizeof(text), "%.2f", s / over);
      return present ? std::string(text) : std::string("-");
    };
    std::printf("%12lld | %10s %10s %10s %10s %10s %10s | %8s %8s %8s %8s %10s\n",
                static_cast<long long>(bytes), us(own, true).c_str(), us(t[1], true).c_str(),
                us(t[2], true).c_str(), us(t[3], true).c_str(), us(shm, shared != nullptr).c_str(),
                us(hier, hierarchical != nullptr).c_str(), ratio(t[1], own, true).c_str(),
                ratio(t[3], own, true).c_str(), ratio(shm, own, shared != nullptr).c_str(),
                ratio(hier, own, hierarchical != nullptr).c_str(), ratio(t[1], t[2], true).c_str());
    std::fflush(stdout);
  }
  if (!ok && rank == 0) std::fprintf(stderr, "error: wrong allreduce results\n");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace gradsync_bench

int main(int argc, char** argv) {
  return gradsync_bench::RunBenchmark("gradsync_bench_host_paths", gradsync_bench::Run, argc, argv);
}
