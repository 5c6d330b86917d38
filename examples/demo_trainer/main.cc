// gradsync demo trainer: data-parallel SGD on an MLP regression, written with no framework.
//
// Every rank draws the same synthetic global batch each step, keeps a contiguous block of rows,
// and hands each layer's gradients to gradsync as soon as backward produces them, so the
// reduction of the last layers overlaps the backward pass of the first ones. Local gradients are
// already divided by the global batch size, so a SUM allreduce yields exactly the full-batch mean
// gradient for any split of the rows, equal or not.
//
// At the end it proves the two properties data parallelism must keep: every replica holds the
// same weights bit for bit, and those weights are the ones a single process training on the full
// batch would reach (up to the rounding of a different summation order).
//
//   mpirun -np 4 gradsync_demo_trainer [--steps N] [--lr X] [--batch N]
#include <gradsync/gradsync.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mlp.h"

namespace {

constexpr int kInputs = 16;
constexpr uint64_t kModelSeed = 7;
constexpr uint64_t kTeacherSeed = 1234;
constexpr uint64_t kDataSeed = 20240611;
constexpr double kNoise = 0.01;
// float64 results differ from the reference only by summation order, ~1e-16 per operation and
// step; 1e-9 leaves orders of magnitude of room while catching any real divergence.
constexpr double kTolerance = 1e-9;

struct Options {
  int steps = 50;
  double lr = 0.2;
  int64_t batch = 512;
};

// Rows [begin, end) of the global batch.
struct Shard {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rows() const { return end - begin; }
};

struct Batch {
  int64_t rows = 0;
  std::vector<double> x;  // [rows x kInputs]
  std::vector<double> y;  // [rows x 1]
};

// Contiguous blocks whose sizes differ by at most one row; ranks beyond the batch get none.
Shard ShardFor(int rank, int size, int64_t batch) {
  return {batch * rank / size, batch * (rank + 1) / size};
}

// A fixed random teacher network plus noise: learnable, but not trivially.
Batch MakeBatch(demo::Mlp& teacher, int step, int64_t rows) {
  demo::Rng rng(kDataSeed ^ (static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ull));
  Batch batch;
  batch.rows = rows;
  batch.x.resize(static_cast<size_t>(rows) * kInputs);
  for (double& v : batch.x) v = rng.Uniform(-1.0, 1.0);
  batch.y = teacher.Forward(batch.x.data(), rows);
  for (double& v : batch.y) v += kNoise * rng.Normal();
  return batch;
}

// Where a step's local sums go. Distributed training reduces them over all ranks; the
// single-process reference leaves them alone. Sharing the training code keeps the comparison fair.
class Reducer {
 public:
  virtual ~Reducer() = default;
  // `data` must stay untouched until WaitAll() returns.
  virtual void Enqueue(const std::string& name, std::vector<double>& data) = 0;
  virtual void WaitAll() = 0;
};

class LocalReducer : public Reducer {
 public:
  void Enqueue(const std::string&, std::vector<double>&) override {}
  void WaitAll() override {}
};

class GradsyncReducer : public Reducer {
 public:
  void Enqueue(const std::string& name, std::vector<double>& data) override {
    gradsync::TensorView view(data.data(), gradsync::DataType::kFloat64,
                              {static_cast<int64_t>(data.size())});
    gradsync::AllreduceOptions options;
    options.name = name;
    options.op = gradsync::ReduceOp::kSum;
    handles_.push_back(gradsync::allreduce(view, options));
  }
  void WaitAll() override {
    for (const gradsync::Handle& h : handles_) h.wait();
    handles_.clear();
  }

 private:
  std::vector<gradsync::Handle> handles_;
};

// One SGD step on this shard; returns the global mean squared error before the update.
double TrainStep(demo::Mlp& model, const Batch& batch, Shard shard, double lr, Reducer& reducer) {
  const double* x = batch.x.data() + shard.begin * kInputs;
  const double* y = batch.y.data() + shard.begin;
  model.Forward(x, shard.rows());
  std::vector<double> loss{model.SquaredErrorSum(y)};
  reducer.Enqueue("loss", loss);
  model.Backward(y, 1.0 / static_cast<double>(batch.rows), [&](int i) {
    demo::Linear& layer = model.layers()[i];
    std::string prefix = "layer" + std::to_string(i);
    reducer.Enqueue(prefix + ".weight", layer.grad_weight);
    reducer.Enqueue(prefix + ".bias", layer.grad_bias);
  });
  // The update must not start before every layer's reduced gradient has landed.
  reducer.WaitAll();
  model.SgdStep(lr);
  return loss[0] / static_cast<double>(batch.rows);
}

std::vector<double> Train(const Options& opt, Shard shard, Reducer& reducer, bool log) {
  demo::Mlp teacher({kInputs, 32, 1}, kTeacherSeed);
  demo::Mlp model({kInputs, 64, 64, 1}, kModelSeed);
  for (int step = 0; step < opt.steps; ++step) {
    Batch batch = MakeBatch(teacher, step, opt.batch);
    double loss = TrainStep(model, batch, shard, opt.lr, reducer);
    if (log) std::printf("step %4d  loss %.9f\n", step + 1, loss);
  }
  return model.Flatten();
}

// Gathers every rank's weights onto every rank; true when all equal this rank's bit for bit. The
// check goes through MPI itself rather than through the library it checks.
bool ReplicasIdentical(const std::vector<double>& weights) {
  const int n = static_cast<int>(weights.size());
  std::vector<double> all(static_cast<size_t>(n) * static_cast<size_t>(gradsync::size()));
  MPI_Allgather(weights.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, MPI_COMM_WORLD);
  bool identical = true;
  for (int r = 0; r < gradsync::size(); ++r) {
    if (std::memcmp(all.data() + static_cast<size_t>(r) * n, weights.data(),
                    static_cast<size_t>(n) * sizeof(double)) != 0) {
      if (gradsync::rank() == 0) std::printf("rank %d's weights differ from rank 0's\n", r);
      identical = false;
    }
  }
  return identical;
}

// Largest |a - b| and whether every element is within kTolerance * max(1, |b|).
bool MatchesReference(const std::vector<double>& a, const std::vector<double>& b,
                      double* max_diff) {
  bool ok = a.size() == b.size();
  *max_diff = 0.0;
  for (size_t i = 0; ok && i < a.size(); ++i) {
    double diff = std::fabs(a[i] - b[i]);
    *max_diff = std::max(*max_diff, diff);
    if (!(diff <= kTolerance * std::max(1.0, std::fabs(b[i])))) ok = false;
  }
  return ok;
}

bool ParseInt(const char* text, int64_t lo, int64_t* out) {
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > (1ll << 30)) return false;
  *out = v;
  return true;
}

bool ParseArgs(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) return false;
    const char* value = argv[++i];
    int64_t n = 0;
    if (flag == "--steps" && ParseInt(value, 0, &n)) {
      opt->steps = static_cast<int>(n);
    } else if (flag == "--batch" && ParseInt(value, 1, &n)) {
      opt->batch = n;
    } else if (flag == "--lr") {
      char* end = nullptr;
      opt->lr = std::strtod(value, &end);
      if (end == value || *end != '\0' || !(opt->lr > 0.0)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// Rank 0's verdicts, sent to every rank so that all of them exit with the same status.
bool ShareVerdict(bool replicas_ok, bool reference_ok) {
  int32_t verdict[2] = {replicas_ok ? 1 : 0, reference_ok ? 1 : 0};
  gradsync::TensorView view(verdict, gradsync::DataType::kInt32, {2});
  gradsync::broadcast(view, 0, {"verdict", nullptr, {}, {}}).wait();
  return verdict[0] == 1 && verdict[1] == 1;
}

int Run(const Options& opt) {
  const int rank = gradsync::rank();
  const int size = gradsync::size();
  const bool root = rank == 0;
  Shard shard = ShardFor(rank, size, opt.batch);
  if (root) {
    int64_t fewest = opt.batch, most = 0;
    for (int r = 0; r < size; ++r) {
      fewest = std::min(fewest, ShardFor(r, size, opt.batch).rows());
      most = std::max(most, ShardFor(r, size, opt.batch).rows());
    }
    std::printf(
        "gradsync demo trainer: %d ranks, MLP %d-64-64-1 float64, global batch %lld "
        "(%lld..%lld rows per rank), %d steps, lr %g\n",
        size, kInputs, static_cast<long long>(opt.batch), static_cast<long long>(fewest),
        static_cast<long long>(most), opt.steps, opt.lr);
  }
  GradsyncReducer reducer;
  std::vector<double> weights = Train(opt, shard, reducer, root);

  bool replicas_ok = ReplicasIdentical(weights);
  bool reference_ok = false;
  if (root) {
    std::printf("replicas identical: %s\n", replicas_ok ? "yes" : "NO");
    LocalReducer local;
    std::vector<double> reference = Train(opt, Shard{0, opt.batch}, local, false);
    double max_diff = 0.0;
    reference_ok = MatchesReference(weights, reference, &max_diff);
    std::printf("matches single-process run: %s, max abs diff %.3g (tolerance %g * max(1, |w|))\n",
                reference_ok ? "yes" : "NO", max_diff, kTolerance);
  }
  return ShareVerdict(replicas_ok, reference_ok) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The replica check calls MPI itself, so the demo starts MPI (with the thread level gradsync
  // needs) and finalizes it; gradsync then uses it as it finds it.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  try {
    gradsync::init();
    Options opt;
    int status = 2;
    if (ParseArgs(argc, argv, &opt)) {
      status = Run(opt);
    } else if (gradsync::rank() == 0) {
      std::fprintf(stderr, "usage: %s [--steps N] [--lr X] [--batch N]\n", argv[0]);
    }
    gradsync::shutdown();
    MPI_Finalize();
    return status;
  } catch (const std::exception& e) {
    // Other ranks may be blocked in a collective this rank will never join: take the job down.
    std::fprintf(stderr, "demo trainer failed: %s\n", e.what());
    int mpi_up = 0, mpi_down = 0;
    MPI_Initialized(&mpi_up);
    MPI_Finalized(&mpi_down);
    if (mpi_up && !mpi_down) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
