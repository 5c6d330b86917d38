// gradsync_bench_libtorch: a libtorch trainer's gradient synchronization through
// gradsync::torch::DistributedModule, with its gradients apart and as views into its buckets
// (gradient_as_bucket_view), against raw MPI_Allreduce of the same gradients tensor by tensor and
// as one flat buffer (copied into a buffer made once, the average folded into the copy back), all
// interleaved in one run in an order shuffled anew each round (MeasureInterleaved).
//
// Sync time is a step's time minus the time of the same step without communication (forward and
// backward alone), measured in the same run: what the trainer waits for beyond its own compute.
// gradsync's reductions overlap backward, so its sync time can be below its reduction time.
// Before timing, one step of each strategy must leave the same averaged gradients (each rank
// trains on a batch of its own, so a reduction that did nothing would differ).
//
//   mpirun -np N gradsync_bench_libtorch [--width 1024] [--depth 8] [--batch 32] [--iters 20]
#include <gradsync/torch.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

struct Args {
  int width = 1024;
  int depth = 8;
  int batch = 32;
  int iters = 20;
};

torch::nn::Sequential MakeModel(const Args& args) {
  torch::nn::Sequential model;
  for (int i = 0; i < args.depth; ++i) {
    model->push_back(torch::nn::Linear(args.width, args.width));
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

// `to` starts from `from`'s weights, so that every strategy computes the same gradients.
void CopyWeights(torch::nn::Sequential& from, torch::nn::Sequential& to) {
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> source = from->parameters();
  const std::vector<torch::Tensor> target = to->parameters();
  for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
}

// The model's gradients, flattened into one tensor.
torch::Tensor Gradients(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> parts;
  for (auto& p : model->parameters()) parts.push_back(p.grad().reshape(-1).clone());
  return torch::cat(parts);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--width")
      args.width = value;
    else if (flag == "--depth")
      args.depth = value;
    else if (flag == "--batch")
      args.batch = value;
    else if (flag == "--iters")
      args.iters = value;
    else {
      std::fprintf(stderr,
                   "usage: gradsync_bench_libtorch [--width W] [--depth D] [--batch B] "
                   "[--iters N]\n");
      return 2;
    }
  }
  torch::set_num_threads(1);
  gradsync::init();
  const int size = gradsync::size();
  torch::manual_seed(0);
  torch::nn::Sequential plain = MakeModel(args);
  torch::nn::Sequential synced = MakeModel(args);
  torch::nn::Sequential viewed = MakeModel(args);
  CopyWeights(plain, synced);
  CopyWeights(plain, viewed);
  gradsync::torch::DistributedModule sync(*synced);
  gradsync::torch::Options view_options;
  view_options.gradient_as_bucket_view = true;
  view_options.name = "viewed";
  gradsync::torch::DistributedModule sync_views(*viewed, view_options);
  torch::manual_seed(1 + gradsync::rank());  // a batch of this rank's own
  const torch::Tensor x = torch::randn({args.batch, args.width});

  auto step = [&](torch::nn::Sequential& model) {
    model->zero_grad();
    model->forward(x).square().mean().backward();
  };
  step(plain);
  int64_t elements = 0;
  for (auto& p : plain->parameters()) elements += p.numel();
  const torch::Tensor flat_buffer = torch::empty({elements});

  auto per_tensor = [&] {
    step(plain);
    for (auto& p : plain->parameters()) {
      torch::Tensor grad = p.grad();
      MPI_Allreduce(MPI_IN_PLACE, grad.data_ptr(), static_cast<int>(grad.numel()), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
      grad.div_(size);
    }
  };
  auto flat = [&] {
    step(plain);
    torch::NoGradGuard no_grad;
    int64_t at = 0;
    for (auto& p : plain->parameters()) {
      flat_buffer.narrow(0, at, p.numel()).copy_(p.grad().reshape(-1));
      at += p.numel();
    }
    MPI_Allreduce(MPI_IN_PLACE, flat_buffer.data_ptr(), static_cast<int>(elements), MPI_FLOAT,
                  MPI_SUM, MPI_COMM_WORLD);
    at = 0;
    for (auto& p : plain->parameters()) {
      torch::Tensor grad = p.grad().view(-1);
      torch::div_out(grad, flat_buffer.narrow(0, at, p.numel()), size);
      at += p.numel();
    }
  };
  auto gradsync_apart = [&] {
    step(synced);
    sync.synchronize();
  };
  auto gradsync_views = [&] {
    step(viewed);
    sync_views.synchronize();
  };

  // Every strategy's averaged gradients, against the per-tensor reduction's; sums in another order
  // round differently, so within a float32 tolerance.
  per_tensor();
  const torch::Tensor expected = Gradients(plain);
  flat();
  const torch::Tensor from_flat = Gradients(plain);
  gradsync_apart();
  const torch::Tensor from_gradsync = Gradients(synced);
  gradsync_views();
  const torch::Tensor from_views = Gradients(viewed);
  bool ok = true;
  for (const auto& [name, got] :
       {std::make_pair("flat", from_flat), std::make_pair("gradsync", from_gradsync),
        std::make_pair("gradsync views", from_views)}) {
    if (!torch::allclose(got, expected, 1e-4, 1e-6)) {
      std::fprintf(stderr, "gradsync_bench_libtorch: rank %d: %s's gradients differ\n",
                   gradsync::rank(), name);
      ok = false;
    }
  }
  if (!gradsync_bench::AllRanksOk(ok, MPI_COMM_WORLD)) {
    gradsync::shutdown();
    return 1;
  }

  const std::vector<gradsync_bench::Strategy> strategies = {{"compute", [&] { step(plain); }},
                                                            {"gradsync", gradsync_apart},
                                                            {"gradsync views", gradsync_views},
                                                            {"per tensor", per_tensor},
                                                            {"flat", flat}};
  const std::vector<double> medians =
      gradsync_bench::MeasureInterleaved(strategies, 2, args.iters, MPI_COMM_WORLD);
  const double b = medians[0];
  const double g = medians[1] - b, v = medians[2] - b, pt = medians[3] - b, f = medians[4] - b;
  if (gradsync::rank() == 0) {
    std::printf(
        "# gradsync_bench_libtorch: %d ranks, %zu tensors, %.1f MB, width %d depth %d "
        "batch %d, median of %d; sync ms = step - compute-only step\n",
        size, plain->parameters().size(), elements * 4 / 1e6, args.width, args.depth, args.batch,
        args.iters);
    std::printf("%10s %10s %10s %12s %10s %8s %8s %8s\n", "step_ms", "gs_sync", "gs_views",
                "pertensor", "flat", "pt/gs", "flat/gs", "pt/views");
    std::printf("%10.2f %10.2f %10.2f %12.2f %10.2f %8.2f %8.2f %8.2f\n", b * 1e3, g * 1e3, v * 1e3,
                pt * 1e3, f * 1e3, pt / g, f / g, pt / v);
  }
  gradsync::shutdown();
  return 0;
}
