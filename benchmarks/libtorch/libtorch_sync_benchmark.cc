// gradsync_bench_libtorch: a libtorch trainer's gradient synchronization through
// gradsync::torch::DistributedModule, with its gradients apart and as views into its buckets
// (gradient_as_bucket_view), against raw MPI_Allreduce of the same gradients tensor by tensor and
// as one flat buffer, interleaved in one run.
//
// Sync time is a step's time minus the time of the same step without communication (forward and
// backward alone), measured in the same run: what the trainer waits for beyond its own compute.
// gradsync's reductions overlap backward, so its sync time can be below its reduction time.
//
//   mpirun -np N gradsync_bench_libtorch [--width 1024] [--depth 8] [--batch 32] [--iters 20]
#include <gradsync/torch.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The slowest rank's value.
double Slowest(double seconds) {
  double out = 0;
  MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
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
  torch::manual_seed(0);
  torch::nn::Sequential synced = MakeModel(args);
  torch::nn::Sequential plain = MakeModel(args);
  torch::nn::Sequential viewed = MakeModel(args);
  gradsync::torch::DistributedModule sync(*synced);
  gradsync::torch::Options view_options;
  view_options.gradient_as_bucket_view = true;
  view_options.name = "viewed";
  gradsync::torch::DistributedModule sync_views(*viewed, view_options);
  const torch::Tensor x = torch::randn({args.batch, args.width});

  std::vector<torch::Tensor> grads;
  int64_t bytes = 0;
  auto step = [&](torch::nn::Sequential& model) {
    model->zero_grad();
    model->forward(x).square().mean().backward();
  };
  step(plain);
  for (auto& p : plain->parameters()) bytes += p.numel() * 4;

  std::vector<double> base, gs, gs_views, per_tensor, flat;
  for (int i = 0; i < args.iters + 2; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    step(plain);
    const double b = Slowest(MPI_Wtime() - t);

    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    step(synced);
    sync.synchronize();
    const double g = Slowest(MPI_Wtime() - t);

    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    step(viewed);
    sync_views.synchronize();
    const double v = Slowest(MPI_Wtime() - t);

    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    step(plain);
    for (auto& p : plain->parameters()) {
      torch::Tensor grad = p.grad();
      MPI_Allreduce(MPI_IN_PLACE, grad.data_ptr(), static_cast<int>(grad.numel()), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
      grad.div_(gradsync::size());
    }
    const double pt = Slowest(MPI_Wtime() - t);

    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    step(plain);
    {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> parts;
      for (auto& p : plain->parameters()) parts.push_back(p.grad().view(-1));
      torch::Tensor buffer = torch::cat(parts);
      MPI_Allreduce(MPI_IN_PLACE, buffer.data_ptr(), static_cast<int>(buffer.numel()), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
      buffer.div_(gradsync::size());
      int64_t at = 0;
      for (auto& p : plain->parameters()) {
        p.grad().view(-1).copy_(buffer.narrow(0, at, p.numel()));
        at += p.numel();
      }
    }
    const double f = Slowest(MPI_Wtime() - t);
    if (i < 2) continue;
    base.push_back(b);
    gs.push_back(g);
    gs_views.push_back(v);
    per_tensor.push_back(pt);
    flat.push_back(f);
  }
  const double b = Median(base);
  const double g = Median(gs) - b, v = Median(gs_views) - b, pt = Median(per_tensor) - b,
               f = Median(flat) - b;
  if (gradsync::rank() == 0) {
    std::printf(
        "# gradsync_bench_libtorch: %d ranks, %zu tensors, %.1f MB, width %d depth %d "
        "batch %d, median of %d; sync ms = step - compute-only step\n",
        gradsync::size(), plain->parameters().size(), bytes / 1e6, args.width, args.depth,
        args.batch, args.iters);
    std::printf("%10s %10s %10s %12s %10s %8s %8s %8s\n", "step_ms", "gs_sync", "gs_views",
                "pertensor", "flat", "pt/gs", "flat/gs", "pt/views");
    std::printf("%10.2f %10.2f %10.2f %12.2f %10.2f %8.2f %8.2f %8.2f\n", b * 1e3, g * 1e3, v * 1e3,
                pt * 1e3, f * 1e3, pt / g, f / g, pt / v);
  }
  gradsync::shutdown();
  return 0;
}
