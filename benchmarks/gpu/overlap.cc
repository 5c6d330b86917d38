#include "overlap.h"

#include <cuda_runtime.h>
#include <gradsync/gradsync.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "busy_kernel.h"
#include "cuda_check.h"
#include "gradient_set.h"
#include "raw_overlap.h"

namespace gradsync_bench {
namespace {

double Seconds(double start) { return MPI_Wtime() - start; }

// Medians over the timed steps, the slowest rank's, in seconds (done_early: a count).
struct OverlapFigures {
  double compute = 0, communication = 0, step = 0;
  double launch_compute = 0, launch_step = 0;  // the host's part: launches (and enqueues)
  double done_early = 0;                       // reductions finished when the backward had
  double tail = 0;                             // from the backward's end to the last handle's
};

// One layout's gradients, with the views, names and options made once, as a trainer makes them:
// the timed loops then time gradsync's enqueue, not the strings and shapes built for it.
class Backward {
 public:
  Backward(const GradientSet& set, const std::vector<float*>& grads, const std::string& prefix,
           cudaStream_t compute, int device)
      : set_(set), grads_(grads), compute_(compute) {
    for (size_t i = 0; i < grads.size(); ++i) {
      views_.emplace_back(grads[i], gradsync::DataType::kFloat32,
                          std::vector<int64_t>{set.tensors[i].num_elements()},
                          gradsync::Device::Cuda(device));
      unordered_.emplace_back();
      unordered_.back().name = prefix + std::to_string(i);
      ordered_.push_back(unordered_.back());
      ordered_.back().ready.cuda_stream = compute;
    }
    handles_.reserve(grads.size());
  }

  // Communication alone: every gradient reduced, last first, nothing to wait for.
  double ReduceAll() {
    const double start = MPI_Wtime();
    handles_.clear();
    for (size_t i = grads_.size(); i-- > 0;) {
      handles_.push_back(gradsync::allreduce(views_[i], unordered_[i]));
    }
    for (auto& h : handles_) h.wait();
    return Seconds(start);
  }

  // The layers, each gradient enqueued (when `reduce`) as its layer is launched. Returns the
  // host's time to launch them: when it exceeds the compute it launches, the device waits for
  // the host rather than for the reductions.
  double Run(long long cycles, bool reduce) {
    handles_.clear();
    const double launch_start = MPI_Wtime();
    for (size_t i = grads_.size(); i-- > 0;) {
      LaunchBusyLayer(compute_, grads_[i], set_.tensors[i].num_elements(), 1.0f, cycles);
      if (reduce) handles_.push_back(gradsync::allreduce(views_[i], ordered_[i]));
    }
    const double launched = Seconds(launch_start);
    CHECK_CUDA(cudaStreamSynchronize(compute_));
    done_early_ = 0;
    for (auto& h : handles_) done_early_ += h.poll() ? 1 : 0;
    const double compute_end = Seconds(launch_start);
    for (auto& h : handles_) h.wait();
    tail_ = Seconds(launch_start) - compute_end;
    return launched;
  }

  // Steps of compute alone, communication alone and both, in turn; the first two untimed.
  OverlapFigures Time(long long cycles, int iters) {
    std::vector<double> compute, communication, step, launch_compute, launch_step, early, tails;
    for (int i = 0; i < iters + 2; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      const double lc = Run(cycles, false);
      const double c = Seconds(t);
      MPI_Barrier(MPI_COMM_WORLD);
      const double m = ReduceAll();
      MPI_Barrier(MPI_COMM_WORLD);
      t = MPI_Wtime();
      const double ls = Run(cycles, true);
      const double s = Seconds(t);
      if (i < 2) continue;
      compute.push_back(c);
      communication.push_back(m);
      step.push_back(s);
      launch_compute.push_back(lc);
      launch_step.push_back(ls);
      early.push_back(done_early_);
      tails.push_back(tail_);
    }
    OverlapFigures f{Median(compute),        Median(communication), Median(step),
                     Median(launch_compute), Median(launch_step),   Median(early),
                     Median(tails)};
    for (double* v :
         {&f.compute, &f.communication, &f.step, &f.launch_compute, &f.launch_step, &f.tail}) {
      MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    return f;
  }

 private:
  const GradientSet& set_;
  std::vector<float*> grads_;
  cudaStream_t compute_;
  std::vector<gradsync::TensorView> views_;
  std::vector<gradsync::AllreduceOptions> unordered_, ordered_;
  std::vector<gradsync::Handle> handles_;
  int done_early_ = 0;
  double tail_ = 0;
};

void PrintFigures(const char* layout, const OverlapFigures& f, size_t gradients,
                  const OverlapOptions& options) {
  std::printf(
      "\n# overlap, ResNet-50 gradients %s, %d rank(s), compute %.3g x communication, "
      "median of %d; ms\n",
      layout, gradsync::size(), options.compute_scale, options.iters);
  std::printf("%10s %10s %10s %16s %12s %12s %14s %12s %8s\n", "compute", "comm", "step",
              "step/max(c,m)", "launch_c", "launch_s", "enqueue_us", "done_early", "tail");
  std::printf("%10.2f %10.2f %10.2f %16.2f %12.2f %12.2f %14.2f %7.0f/%-4zu %8.2f\n",
              f.compute * 1e3, f.communication * 1e3, f.step * 1e3,
              f.step / std::max(f.compute, f.communication), f.launch_compute * 1e3,
              f.launch_step * 1e3,
              (f.launch_step - f.launch_compute) / static_cast<double>(gradients) * 1e6,
              f.done_early, gradients, f.tail * 1e3);
}

}  // namespace

void Overlap(const OverlapOptions& options, int device) {
  const GradientSet set = LoadGradientSet(options.data_dir + "/resnet50.txt");
  std::vector<int64_t> counts;
  for (const auto& spec : set.tensors) counts.push_back(spec.num_elements());
  std::vector<float*> apart;
  for (int64_t n : counts) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(float)));
    apart.push_back(static_cast<float*>(p));
  }
  // The flat layout: the last gradient (backward's first) at the allocation's start.
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  float* allocation = nullptr;
  CHECK_CUDA(cudaMalloc(&allocation, static_cast<size_t>(total) * sizeof(float)));
  std::vector<float*> flat(counts.size());
  int64_t offset = 0;
  for (size_t i = counts.size(); i-- > 0;) {
    flat[i] = allocation + offset;
    offset += counts[i];
  }
  cudaStream_t compute;
  CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  Backward apart_backward(set, apart, "overlap.", compute, device);
  Backward flat_backward(set, flat, "overlap.flat.", compute, device);

  // Communication alone decides the compute per layer. The untimed steps before each layout's
  // timed ones also let the schedule lock on that layout's names.
  for (int i = 0; i < 2; ++i) apart_backward.ReduceAll();
  std::vector<double> comm;
  for (int i = 0; i < 5; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    comm.push_back(apart_backward.ReduceAll());
  }
  double comm_s = Median(comm);
  MPI_Allreduce(MPI_IN_PLACE, &comm_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int clock_khz = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  const long long cycles =
      static_cast<long long>(comm_s * options.compute_scale / static_cast<double>(counts.size()) *
                             static_cast<double>(clock_khz) * 1e3);
  const OverlapFigures apart_figures = apart_backward.Time(cycles, options.iters);
  for (int i = 0; i < 7; ++i) flat_backward.ReduceAll();
  const OverlapFigures flat_figures = flat_backward.Time(cycles, options.iters);
  if (gradsync::rank() == 0) {
    PrintFigures("(each its own allocation)", apart_figures, counts.size(), options);
    PrintFigures("(views into one flat allocation)", flat_figures, counts.size(), options);
  }
  // The floor on the same machine, where an NCCL communicator can be formed (not for ranks
  // sharing a GPU): gradients as views into 25 MiB buckets, one ncclAllReduce a bucket.
  if (options.raw_nccl) {
    const RawOverlap raw = MeasureRawOverlap(counts, cycles, int64_t{25} << 20, options.iters);
    if (gradsync::rank() == 0) {
      std::printf(
          "\n# overlap, raw baselines: the same layers, %d buckets of 25 MiB, one "
          "ncclAllReduce a bucket once its last layer is launched, gradients as views into the "
          "buckets and (copies) copied in and out as DDP's default does; gs: apart, and flat; "
          "ms\n",
          raw.buckets);
      const double longest = std::max(raw.compute, raw.communication);
      std::printf("%10s %10s %10s %16s %12s %12s %12s %12s %16s %14s\n", "compute", "comm", "step",
                  "step/max(c,m)", "launch_s", "gs/raw_step", "flat/raw", "copies_step",
                  "copies/max(c,m)", "gs/copies");
      std::printf("%10.2f %10.2f %10.2f %16.2f %12.2f %12.2f %12.2f %12.2f %16.2f %14.2f\n",
                  raw.compute * 1e3, raw.communication * 1e3, raw.step * 1e3, raw.step / longest,
                  raw.launch * 1e3, apart_figures.step / raw.step, flat_figures.step / raw.step,
                  raw.step_copies * 1e3, raw.step_copies / longest,
                  apart_figures.step / raw.step_copies);
    }
  }
  for (float* p : apart) cudaFree(p);
  cudaFree(allocation);
  cudaStreamDestroy(compute);
}

}  // namespace gradsync_bench
