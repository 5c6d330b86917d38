// A libtorch trainer made data-parallel by gradsync: the two marked lines are all it adds. It fits
// a small MLP to synthetic regression data; each rank trains on its shard of every global batch.
//
//   mpirun -np 4 gradsync_libtorch_train [--steps N] [--batch B] [--accumulate K]
//          [--compression none|fp16|bf16] [--bucket-bytes N] [--bucket-views]
//          [--device cpu|cuda] [--check] [--elastic] [--step-ms MS]
//
// --device cuda trains on each rank's GPU (the local rank's, as gradsync picks it).
// --bucket-views makes the gradients views into the buckets (Options::gradient_as_bucket_view).
// --accumulate K splits each rank's shard into K micro-batches, the first K - 1 under no_sync().
// --check also trains, on every rank, one process's copy of the model on the whole global batch,
// and fails unless every replica ends identical and within the tolerance of that copy.
// --elastic makes it an elastic trainer (under gradsyncrun --min-np/--max-np, docs/elastic.md): it
// resumes from the job's newest commit and commits its state after every step, leaving for a
// restart when the launcher announces other hosts; --step-ms pauses each step, for the tests.
// --batch must then divide by every number of ranks the job may run with.
#include <gradsync/elastic.h>
#include <gradsync/gradsync.h>
#include <gradsync/torch.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

struct Args {
  int steps = 30;
  int batch = 64;  // global, over every rank
  int accumulate = 1;
  std::string compression = "none";
  int64_t bucket_bytes = int64_t{25} << 20;
  bool check = false;
  bool bucket_views = false;
  bool cuda = false;
  bool elastic = false;
  int step_ms = 0;
};

Args Parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (flag == "--check" || flag == "--elastic" || flag == "--bucket-views") {
      (flag == "--check"     ? args.check
       : flag == "--elastic" ? args.elastic
                             : args.bucket_views) = true;
      continue;
    }
    if (value == nullptr) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      std::exit(2);
    }
    ++i;
    if (flag == "--steps")
      args.steps = std::atoi(value);
    else if (flag == "--batch")
      args.batch = std::atoi(value);
    else if (flag == "--accumulate")
      args.accumulate = std::atoi(value);
    else if (flag == "--compression")
      args.compression = value;
    else if (flag == "--bucket-bytes")
      args.bucket_bytes = std::atoll(value);
    else if (flag == "--step-ms")
      args.step_ms = std::atoi(value);
    else if (flag == "--device") {
      if (std::strcmp(value, "cpu") != 0 && std::strcmp(value, "cuda") != 0) {
        std::fprintf(stderr, "--device: cpu or cuda\n");
        std::exit(2);
      }
      args.cuda = std::strcmp(value, "cuda") == 0;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return args;
}

gradsync::torch::Compression CompressionOf(const std::string& name) {
  if (name == "fp16") return gradsync::torch::Compression::kFloat16;
  if (name == "bf16") return gradsync::torch::Compression::kBFloat16;
  if (name != "none") {
    std::fprintf(stderr, "--compression: none, fp16 or bf16\n");
    std::exit(2);
  }
  return gradsync::torch::Compression::kNone;
}

// The largest difference between the two models' parameters.
double MaxDifference(Net& a, Net& b) {
  double worst = 0;
  auto pa = a.parameters();
  auto pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

// The trainer's state, as gradsync::elastic::commit takes it: the next step, and both models with
// their optimizers (the reference's too, so that --check holds across restarts).
std::string SaveState(int64_t next_step, Net& net, torch::optim::SGD& optimizer, Net& reference,
                      torch::optim::SGD& reference_optimizer) {
  torch::serialize::OutputArchive archive, parts[4];
  net.save(parts[0]);
  optimizer.save(parts[1]);
  reference.save(parts[2]);
  reference_optimizer.save(parts[3]);
  archive.write("next_step", torch::tensor(next_step));
  archive.write("net", parts[0]);
  archive.write("optimizer", parts[1]);
  archive.write("reference", parts[2]);
  archive.write("reference_optimizer", parts[3]);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

// Loads what SaveState made; returns its next step.
int64_t LoadState(const std::string& bytes, const torch::Device& device, Net& net,
                  torch::optim::SGD& optimizer, Net& reference,
                  torch::optim::SGD& reference_optimizer) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive, parts[4];
  archive.load_from(in, device);
  torch::Tensor next_step;
  archive.read("next_step", next_step);
  archive.read("net", parts[0]);
  archive.read("optimizer", parts[1]);
  archive.read("reference", parts[2]);
  archive.read("reference_optimizer", parts[3]);
  net.load(parts[0]);
  optimizer.load(parts[1]);
  reference.load(parts[2]);
  reference_optimizer.load(parts[3]);
  return next_step.item<int64_t>();
}

// Whether every rank holds the same parameters: their element-wise max and min agree.
bool ReplicasIdentical(Net& net) {
  bool same = true;
  int k = 0;
  for (const torch::Tensor& p : net.parameters()) {
    torch::Tensor high = p.detach().to(torch::kCPU).clone();
    torch::Tensor low = high.clone();
    gradsync::AllreduceOptions max_options;
    max_options.name = "check.max." + std::to_string(k);
    max_options.op = gradsync::ReduceOp::kMax;
    gradsync::AllreduceOptions min_options;
    min_options.name = "check.min." + std::to_string(k++);
    min_options.op = gradsync::ReduceOp::kMin;
    auto view = [](torch::Tensor& t) {
      return gradsync::TensorView(t.data_ptr(), gradsync::DataType::kFloat32, t.sizes().vec());
    };
    gradsync::Handle h1 = gradsync::allreduce(view(high), max_options);
    gradsync::Handle h2 = gradsync::allreduce(view(low), min_options);
    h1.wait();
    h2.wait();
    same = same && torch::equal(high, low);
  }
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  gradsync::init();
  const int rank = gradsync::rank();
  const int size = gradsync::size();
  if (args.batch % (size * args.accumulate) != 0) {
    if (rank == 0) std::fprintf(stderr, "--batch must divide by ranks x --accumulate\n");
    gradsync::shutdown();
    return 2;
  }
  // The same data on every rank; different initial weights, which rank 0's replace.
  const torch::Device device =
      args.cuda
          ? torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(
                                            gradsync::local_rank() %
                                            std::max<int64_t>(1, torch::cuda::device_count())))
          : torch::Device(torch::kCPU);
  torch::manual_seed(1234);
  torch::Tensor inputs = torch::randn({args.steps, args.batch, 16});
  torch::Tensor targets = torch::sin(inputs.matmul(torch::randn({16, 4}))) +
                          0.01 * torch::randn({args.steps, args.batch, 4});
  inputs = inputs.to(device);
  targets = targets.to(device);
  torch::manual_seed(100 + rank);
  Net net;
  net.to(device);

  gradsync::torch::Options options;  // gradsync
  options.compression = CompressionOf(args.compression);
  options.bucket_bytes = args.bucket_bytes;
  options.gradient_as_bucket_view = args.bucket_views;
  gradsync::torch::DistributedModule sync(net, options);  // gradsync

  Net reference;  // one process on the whole batch, from the same start
  reference.to(device);
  {
    torch::NoGradGuard no_grad;
    auto from = net.parameters();
    auto to = reference.parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  torch::optim::SGD optimizer(net.parameters(), 0.05);
  torch::optim::SGD reference_optimizer(reference.parameters(), 0.05);

  const int shard = args.batch / size;
  const int micro = shard / args.accumulate;
  // The loss is read once, after the last step: reading it every step would wait for the GPU
  // and hide a reduction that did not wait for its gradient's kernel.
  torch::Tensor last_loss;
  int first_step = 0;
  if (args.elastic) {
    const gradsync::elastic::Resumed resumed = gradsync::elastic::resume();
    if (resumed.commit >= 0) {
      first_step = static_cast<int>(
          LoadState(resumed.state, device, net, optimizer, reference, reference_optimizer));
    }
    if (rank == 0) {
      std::printf("libtorch_train: %d ranks, from step %d (commit %lld)\n", size, first_step,
                  static_cast<long long>(resumed.commit));
      std::fflush(stdout);
    }
  }
  for (int step = first_step; step < args.steps; ++step) {
    const torch::Tensor x = inputs[step].narrow(0, rank * shard, shard);
    const torch::Tensor y = targets[step].narrow(0, rank * shard, shard);
    optimizer.zero_grad();
    for (int m = 0; m < args.accumulate; ++m) {
      auto run = [&] {
        const torch::Tensor loss = torch::mse_loss(net.forward(x.narrow(0, m * micro, micro)),
                                                   y.narrow(0, m * micro, micro)) /
                                   args.accumulate;
        loss.backward();
        last_loss = loss.detach() * args.accumulate;
      };
      if (m + 1 < args.accumulate) {
        auto guard = sync.no_sync();
        run();
      } else {
        run();
      }
    }
    sync.synchronize();
    optimizer.step();
    if (args.check) {
      reference_optimizer.zero_grad();
      torch::mse_loss(reference.forward(inputs[step]), targets[step]).backward();
      reference_optimizer.step();
    }
    if (args.elastic) {
      std::this_thread::sleep_for(std::chrono::milliseconds(args.step_ms));
      if (gradsync::elastic::commit(
              SaveState(step + 1, net, optimizer, reference, reference_optimizer))) {
        gradsync::elastic::leave_for_restart();
      }
    }
  }

  const double loss_value = last_loss.defined() ? last_loss.item<double>() : 0.0;
  int failed = 0;
  if (args.check) {
    const double difference = MaxDifference(net, reference);
    const double tolerance = args.compression == "none" ? 1e-5 : 1e-4;
    const bool identical = ReplicasIdentical(net);
    failed = difference > tolerance || !identical;
    if (rank == 0 || failed) {
      std::printf(
          "libtorch_train: rank %d of %d on %s, %d steps, batch %d, accumulate %d, "
          "compression %s: loss %.5f, max |distributed - one process| = %.3g (tolerance %.0e), "
          "replicas %s%s\n",
          rank, size, args.cuda ? "cuda" : "cpu", args.steps, args.batch, args.accumulate,
          args.compression.c_str(), loss_value, difference, tolerance,
          identical ? "identical" : "DIFFER", failed ? " -- FAILED" : "");
    }
  } else if (rank == 0) {
    std::printf("libtorch_train: %d ranks, %d steps, final loss %.5f\n", size, args.steps,
                loss_value);
  }
  gradsync::shutdown();
  return failed;
}
