// gradsync_bench_gpu: the device data plane's figures, on a GPU machine.
//
//   1. Fusion copy: the batched copy of a real model's gradient set into the fusion buffer and out
//      again, against cudaMemcpyAsync moving the same bytes as one block (the device's copy
//      bandwidth) and tensor by tensor, interleaved in one run. "of memcpy" is the block copy's
//      time over the batched copy's: the fraction of memcpy bandwidth the batched copy reaches.
//      Then the host's time to launch one batched copy (copy_launch.h), by segment count, with
//      its descriptors in the parameter and from a table, on a free stream and behind a kernel.
//   2. Overlap (overlap.h): a synthetic backward of ResNet-50's gradients, each enqueued as its
//      layer is launched, against compute alone and communication alone, with the gradients
//      apart and as views into one allocation; then the raw baselines of the same
//      (raw_overlap.h): 25 MiB buckets, one ncclAllReduce a bucket, the gradients views into
//      them (the floor) or copied in and out (DDP's default).
//   3. An nccl-tests-style table (bytes, time, algbw, busbw) for gradsync's allreduce of one
//      float32 tensor, 4 B to --max-bytes, beside a raw ncclAllReduce on a communicator of its
//      own, or (under GRADSYNC_GPU_BACKEND=mpi, or where ranks share a GPU) beside a raw
//      MPI_Allreduce staged through pinned host memory as that backend stages it. `gs_call_us` is
//      the part of gradsync's time spent in the allreduce call itself (the enqueue and, locked, the
//      caller's launch); the rest is the device's work and the completion reaching the waiting
//      caller. --table-iters sets its timed operations per size (default --iters).
//
// Run as `mpirun -np N gradsync_bench_gpu` or alone; each rank uses GPU local_rank() % devices.
#include <cuda_runtime.h>
#include <gradsync/gradsync.h>
#include <mpi.h>
#include <nccl.h>

#include <strings.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench_common.h"
#include "copy_launch.h"
#include "cuda_check.h"
#include "gradient_set.h"
#include "ops/cuda/cuda_batched_copy.h"
#include "ops/device/bucket_layout.h"
#include "overlap.h"

namespace {

struct Options {
  std::string data_dir;
  int iters = 20;
  // The allreduce table's own (0: iters): ranks sharing a GPU take turns on it, and a median of
  // 20 small operations there moved by half from one run to the next.
  int table_iters = 0;
  int64_t max_bytes = int64_t{1} << 30;
  // The backward's compute as a multiple of the communication alone: 1 is the overlap goal's
  // hardest case; larger values give each layer a realistic share of the step.
  double compute_scale = 1.0;
  // Whether the raw baselines use NCCL (RawNcclPossible), or stage through the host as gradsync's
  // MPI backend does.
  bool raw_nccl = true;
};

// Whether the raw baselines can use NCCL: not where two ranks use one GPU, which NCCL refuses
// (gradsync then picks its MPI backend itself), nor under GRADSYNC_GPU_BACKEND=mpi, whose
// baseline is the same staging by hand. Collective.
bool RawNcclPossible(int device) {
  const char* backend = std::getenv("GRADSYNC_GPU_BACKEND");
  bool possible = backend == nullptr || strcasecmp(backend, "mpi") != 0;
  char name[MPI_MAX_PROCESSOR_NAME + 32] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  name[length] = '/';
  CHECK_CUDA(cudaDeviceGetPCIBusId(name + length + 1, 31, device));
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(sizeof(name) * static_cast<size_t>(size));
  MPI_Allgather(name, sizeof(name), MPI_CHAR, all.data(), sizeof(name), MPI_CHAR, MPI_COMM_WORLD);
  std::set<std::string> gpus;
  for (int r = 0; r < size; ++r) {
    if (!gpus.insert(std::string(&all[sizeof(name) * static_cast<size_t>(r)])).second) {
      possible = false;
    }
  }
  return possible;
}

using gradsync_bench::Median;

// Milliseconds of `work` on `stream`, timed with events.
template <typename Work>
double TimeOnStream(cudaStream_t stream, Work work) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  work();
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

void FusionCopy(const Options& options, const std::string& set_name, int device) {
  const gradsync_bench::GradientSet set =
      gradsync_bench::LoadGradientSet(options.data_dir + "/" + set_name + ".txt");
  std::vector<void*> tensors;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const auto& spec : set.tensors) {
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(spec.num_elements()) * sizeof(float);
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemset(p, 1, bytes));
    tensors.push_back(p);
    offsets.push_back(total);
    // As the device plane lays a bucket out.
    total = gradsync::AlignBucketSegment(total + bytes);
  }
  void* fusion = nullptr;
  void* block_src = nullptr;
  CHECK_CUDA(cudaMalloc(&fusion, total));
  CHECK_CUDA(cudaMalloc(&block_src, total));
  std::vector<gradsync::CopySegment> in, out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = set.tensors[i].num_elements();
    in.push_back({tensors[i], static_cast<char*>(fusion) + offsets[i], n, 1.0});
    out.push_back({static_cast<char*>(fusion) + offsets[i], tensors[i], n, 1.0});
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::unique_ptr<gradsync::CudaBatchedCopier> made;
  if (!gradsync::CudaBatchedCopier::Create(device, false, &made).ok()) std::abort();
  gradsync::CudaBatchedCopier& copier = *made;
  std::vector<double> batched_in, batched_out, scaled_in, block, per_tensor;
  std::vector<gradsync::CopySegment> scaled = in;
  for (auto& s : scaled) s.scale = 0.5;
  for (int i = 0; i < options.iters + 2; ++i) {
    const double a =
        TimeOnStream(stream, [&] { copier.Launch(in, gradsync::DataType::kFloat32, stream); });
    const double b =
        TimeOnStream(stream, [&] { copier.Launch(out, gradsync::DataType::kFloat32, stream); });
    const double c =
        TimeOnStream(stream, [&] { copier.Launch(scaled, gradsync::DataType::kFloat32, stream); });
    const double d = TimeOnStream(stream, [&] {
      CHECK_CUDA(cudaMemcpyAsync(fusion, block_src, total, cudaMemcpyDeviceToDevice, stream));
    });
    const double e = TimeOnStream(stream, [&] {
      for (size_t t = 0; t < tensors.size(); ++t) {
        CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(fusion) + offsets[t], tensors[t],
                                   set.tensors[t].num_elements() * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream));
      }
    });
    if (i < 2) continue;  // warm-up
    batched_in.push_back(a);
    batched_out.push_back(b);
    scaled_in.push_back(c);
    block.push_back(d);
    per_tensor.push_back(e);
  }
  const double gb = static_cast<double>(total) / 1e9;
  const double block_ms = Median(block);
  std::printf("%-10s %7zu %9.1f %9.3f %9.3f %9.3f %9.3f %9.3f %8.2f %8.2f %8.2f %8.1f\n",
              set_name.c_str(), tensors.size(), total / 1e6, Median(batched_in),
              Median(batched_out), Median(scaled_in), block_ms, Median(per_tensor),
              block_ms / Median(batched_in), block_ms / Median(batched_out),
              block_ms / Median(scaled_in), 2 * gb / (block_ms / 1e3));
  made.reset();  // before its stream
  for (void* p : tensors) cudaFree(p);
  cudaFree(fusion);
  cudaFree(block_src);
  cudaStreamDestroy(stream);
}

// The timed loop reduced zeros: one more allreduce of ones must give `size` everywhere, or the
// table's figures are not of a working allreduce and the run stops.
void CheckOneAllreduce(const gradsync::TensorView& view, const gradsync::AllreduceOptions& named,
                       int64_t count, int size) {
  std::vector<float> host(static_cast<size_t>(count), 1.0f);
  const size_t bytes = host.size() * sizeof(float);
  CHECK_CUDA(cudaMemcpy(view.data, host.data(), bytes, cudaMemcpyHostToDevice));
  gradsync::allreduce(view, named).wait();
  CHECK_CUDA(cudaMemcpy(host.data(), view.data, bytes, cudaMemcpyDeviceToHost));
  for (size_t k = 0; k < host.size(); ++k) {
    if (host[k] != static_cast<float>(size)) {
      std::fprintf(stderr,
                   "gradsync_bench_gpu: allreduce of %lld floats: element %zu is %g, not %d\n",
                   static_cast<long long>(count), k, host[k], size);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  CHECK_CUDA(cudaMemset(view.data, 0, bytes));
}

void AllreduceTable(const Options& options, int device) {
  const int rank = gradsync::rank();
  const int size = gradsync::size();
  // Ranks sharing the GPU (the MPI backend's runs) cannot form a raw NCCL communicator: their
  // baseline is what the MPI backend does by hand, staged through pinned host memory.
  const bool raw_nccl = options.raw_nccl;
  const int iters = options.table_iters > 0 ? options.table_iters : options.iters;
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (raw_nccl) {
    if (rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK_NCCL(ncclCommInitRank(&comm, size, id, rank));
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, static_cast<size_t>(options.max_bytes)));
  CHECK_CUDA(cudaMemset(buffer, 0, static_cast<size_t>(options.max_bytes)));
  void* pinned = nullptr;
  if (!raw_nccl) CHECK_CUDA(cudaMallocHost(&pinned, static_cast<size_t>(options.max_bytes)));
  auto raw_allreduce = [&](int64_t count) {
    if (raw_nccl) {
      CHECK_NCCL(ncclAllReduce(buffer, buffer, count, ncclFloat32, ncclSum, comm, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      return;
    }
    const size_t bytes = static_cast<size_t>(count) * 4;
    CHECK_CUDA(cudaMemcpyAsync(pinned, buffer, bytes, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    MPI_Allreduce(MPI_IN_PLACE, pinned, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    CHECK_CUDA(cudaMemcpyAsync(buffer, pinned, bytes, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  if (rank == 0) {
    std::printf(
        "\n# allreduce of one named tensor (its schedule locked), float32 sum, %d rank(s), "
        "median of %d; raw = %s\n",
        size, iters,
        raw_nccl ? "ncclAllReduce"
                 : "MPI_Allreduce staged through pinned host memory (copies included)");
    std::printf("%12s %12s %10s %10s %12s %10s %10s %8s %10s\n", "bytes", "gs_us", "gs_algbw",
                "gs_busbw", "raw_us", "raw_algbw", "raw_busbw", "gs/raw", "gs_call_us");
  }
  // A named tensor, as a training loop's are: after GRADSYNC_LOCK_AFTER_STEPS (3) repetitions
  // its schedule locks, within the warm-up.
  constexpr int kWarmup = 8;
  for (int64_t bytes = 4; bytes <= options.max_bytes; bytes *= 4) {
    const int64_t count = bytes / 4;
    gradsync::AllreduceOptions named;
    named.name = "bench.allreduce." + std::to_string(bytes);
    const gradsync::TensorView view(buffer, gradsync::DataType::kFloat32, {count},
                                    gradsync::Device::Cuda(device));
    std::vector<double> gs, calls, raw_times;
    for (int i = 0; i < iters + kWarmup; ++i) {
      double call_s = 0, gs_s = 0, raw_s = 0;
      const auto time_gradsync = [&] {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        gradsync::Handle handle = gradsync::allreduce(view, named);
        call_s = MPI_Wtime() - t0;  // the enqueue, and the launch the caller makes
        handle.wait();
        gs_s = MPI_Wtime() - t0;
      };
      const auto time_raw = [&] {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        raw_allreduce(count);
        raw_s = MPI_Wtime() - t0;
      };
      // Each goes first in every other iteration, so neither always follows the other.
      if (i % 2 == 0) {
        time_gradsync();
        time_raw();
      } else {
        time_raw();
        time_gradsync();
      }
      if (i < kWarmup) continue;
      gs.push_back(gs_s);
      calls.push_back(call_s);
      raw_times.push_back(raw_s);
    }
    CheckOneAllreduce(view, named, count, size);
    double gs_med = Median(gs), raw_med = Median(raw_times), call_med = Median(calls);
    MPI_Allreduce(MPI_IN_PLACE, &gs_med, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &call_med, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &raw_med, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const double bus = size > 1 ? 2.0 * (size - 1) / size : 1.0;
    if (rank == 0) {
      const double gs_alg = bytes / gs_med / 1e9, raw_alg = bytes / raw_med / 1e9;
      std::printf("%12lld %12.1f %10.2f %10.2f %12.1f %10.2f %10.2f %8.2f %10.1f\n",
                  static_cast<long long>(bytes), gs_med * 1e6, gs_alg, gs_alg * bus, raw_med * 1e6,
                  raw_alg, raw_alg * bus, gs_med / raw_med, call_med * 1e6);
    }
  }
  cudaFree(buffer);
  if (pinned != nullptr) cudaFreeHost(pinned);
  if (comm != nullptr) ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  const char* env_dir = std::getenv("GRADSYNC_DATA_DIR");
  options.data_dir = env_dir != nullptr ? env_dir : "../shared/data";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--data-dir")
      options.data_dir = argv[i + 1];
    else if (flag == "--iters")
      options.iters = std::atoi(argv[i + 1]);
    else if (flag == "--table-iters")
      options.table_iters = std::atoi(argv[i + 1]);
    else if (flag == "--max-bytes")
      options.max_bytes = std::atoll(argv[i + 1]);
    else if (flag == "--compute-scale")
      options.compute_scale = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: gradsync_bench_gpu [--data-dir DIR] [--iters N] [--table-iters N] "
                   "[--max-bytes B] [--compute-scale F]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gradsync_bench_gpu: no CUDA device\n");
    return 77;
  }
  gradsync::init();
  const int device = gradsync::local_rank() % devices;
  CHECK_CUDA(cudaSetDevice(device));
  options.raw_nccl = RawNcclPossible(device);
  if (gradsync::rank() == 0) {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, device);
    std::printf("# gradsync_bench_gpu on %s, %d rank(s)\n", prop.name, gradsync::size());
    std::printf("# fusion copy, float32, median of %d; ms; 'of memcpy' = block memcpy / batched\n",
                options.iters);
    std::printf("%-10s %7s %9s %9s %9s %9s %9s %9s %8s %8s %8s %8s\n", "set", "tensors", "MB",
                "in_ms", "out_ms", "in_x0.5", "block_ms", "pertns_ms", "in/mcpy", "out/mcpy",
                "sc/mcpy", "mcpyGB/s");
    for (const char* set : {"resnet50", "bert_base"}) FusionCopy(options, set, device);
    gradsync_bench::CopyLaunchCost(device, options.iters);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  gradsync_bench::Overlap(
      {options.data_dir, options.iters, options.compute_scale, options.raw_nccl}, device);
  AllreduceTable(options, device);
  gradsync::shutdown();
  return 0;
}
