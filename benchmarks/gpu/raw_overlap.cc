#include "raw_overlap.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "bench_common.h"
#include "busy_kernel.h"
#include "cuda_check.h"

namespace gradsync_bench {

namespace {

// The buckets of a backward that produces gradients last first, as DDP forms them: each holds
// consecutive gradients until it reaches `bucket_bytes`.
struct Buckets {
  std::vector<float*> flat;                  // one allocation a bucket
  std::vector<int64_t> elements;             // each bucket's float count
  std::vector<float*> gradient;              // each gradient's view into its bucket
  std::vector<int> closes;                   // per gradient: the bucket its layer completes, or -1
  std::vector<std::vector<size_t>> members;  // each bucket's gradients, in backward's order
};

Buckets MakeBuckets(const std::vector<int64_t>& counts, int64_t bucket_bytes) {
  Buckets b;
  b.gradient.resize(counts.size());
  b.closes.assign(counts.size(), -1);
  int64_t bytes = bucket_bytes;  // a bucket is opened by the first gradient
  for (size_t i = counts.size(); i-- > 0;) {
    if (bytes >= bucket_bytes) {
      b.members.emplace_back();
      b.elements.push_back(0);
      bytes = 0;
    }
    b.members.back().push_back(i);
    b.elements.back() += counts[i];
    bytes += counts[i] * static_cast<int64_t>(sizeof(float));
  }
  for (size_t k = 0; k < b.members.size(); ++k) {
    float* flat = nullptr;
    CHECK_CUDA(cudaMalloc(&flat, static_cast<size_t>(b.elements[k]) * sizeof(float)));
    b.flat.push_back(flat);
    int64_t offset = 0;
    for (size_t i : b.members[k]) {
      b.gradient[i] = flat + offset;
      offset += counts[i];
    }
    b.closes[b.members[k].back()] = static_cast<int>(k);  // the last produced
  }
  return b;
}

}  // namespace

RawOverlap MeasureRawOverlap(const std::vector<int64_t>& counts, long long cycles,
                             int64_t bucket_bytes, int iters) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ncclUniqueId id;
  if (rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t nccl = nullptr;
  CHECK_NCCL(ncclCommInitRank(&nccl, size, id, rank));
  cudaStream_t compute, comm;
  CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  // At the device's highest priority, as gradsync's communication stream is.
  int least = 0, greatest = 0;
  CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CHECK_CUDA(cudaStreamCreateWithPriority(&comm, cudaStreamNonBlocking, greatest));
  const Buckets buckets = MakeBuckets(counts, bucket_bytes);
  std::vector<cudaEvent_t> layer_done(buckets.flat.size());
  for (cudaEvent_t& e : layer_done) {
    CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  std::vector<cudaEvent_t> reduced(buckets.flat.size());
  for (cudaEvent_t& e : reduced) CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // DDP's default layout: each layer writes a gradient of its own, copied into its bucket as it
  // comes and back once the bucket is reduced.
  std::vector<float*> own(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    CHECK_CUDA(cudaMalloc(&own[i], static_cast<size_t>(counts[i]) * sizeof(float)));
  }
  auto reduce = [&](size_t k) {
    CHECK_NCCL(ncclAllReduce(buckets.flat[k], buckets.flat[k],
                             static_cast<size_t>(buckets.elements[k]), ncclFloat32, ncclSum, nccl,
                             comm));
  };
  auto bytes_of = [&](size_t i) { return static_cast<size_t>(counts[i]) * sizeof(float); };
  auto backward_with_copies = [&] {
    const double start = MPI_Wtime();
    for (size_t i = counts.size(); i-- > 0;) {
      LaunchBusyLayer(compute, own[i], counts[i], 1.0f, cycles);
      CHECK_CUDA(cudaMemcpyAsync(buckets.gradient[i], own[i], bytes_of(i), cudaMemcpyDeviceToDevice,
                                 compute));
      const int k = buckets.closes[i];
      if (k < 0) continue;
      CHECK_CUDA(cudaEventRecord(layer_done[k], compute));
      CHECK_CUDA(cudaStreamWaitEvent(comm, layer_done[k], 0));
      reduce(static_cast<size_t>(k));
      CHECK_CUDA(cudaEventRecord(reduced[k], comm));
    }
    for (size_t k = 0; k < buckets.flat.size(); ++k) {
      CHECK_CUDA(cudaStreamWaitEvent(compute, reduced[k], 0));
      for (size_t i : buckets.members[k]) {
        CHECK_CUDA(cudaMemcpyAsync(own[i], buckets.gradient[i], bytes_of(i),
                                   cudaMemcpyDeviceToDevice, compute));
      }
    }
    const double launched = MPI_Wtime() - start;
    CHECK_CUDA(cudaStreamSynchronize(compute));
    return launched;
  };
  // Returns the host's time to launch.
  auto backward = [&](bool reduce_buckets) {
    const double start = MPI_Wtime();
    for (size_t i = counts.size(); i-- > 0;) {
      LaunchBusyLayer(compute, buckets.gradient[i], counts[i], 1.0f, cycles);
      const int k = buckets.closes[i];
      if (!reduce_buckets || k < 0) continue;
      CHECK_CUDA(cudaEventRecord(layer_done[k], compute));
      CHECK_CUDA(cudaStreamWaitEvent(comm, layer_done[k], 0));
      reduce(static_cast<size_t>(k));
    }
    const double launched = MPI_Wtime() - start;
    CHECK_CUDA(cudaStreamSynchronize(compute));
    CHECK_CUDA(cudaStreamSynchronize(comm));
    return launched;
  };
  std::vector<double> compute_alone, comm_alone, step, launch, step_copies, launch_copies;
  for (int i = 0; i < iters + 2; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    backward(false);
    const double c = MPI_Wtime() - t;
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    for (size_t k = 0; k < buckets.flat.size(); ++k) reduce(k);
    CHECK_CUDA(cudaStreamSynchronize(comm));
    const double m = MPI_Wtime() - t;
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    const double l = backward(true);
    const double s = MPI_Wtime() - t;
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    const double lc = backward_with_copies();
    const double sc = MPI_Wtime() - t;
    if (i < 2) continue;  // warm-up
    compute_alone.push_back(c);
    comm_alone.push_back(m);
    step.push_back(s);
    launch.push_back(l);
    step_copies.push_back(sc);
    launch_copies.push_back(lc);
  }
  RawOverlap result;
  result.buckets = static_cast<int>(buckets.flat.size());
  result.compute = Median(compute_alone);
  result.communication = Median(comm_alone);
  result.step = Median(step);
  result.launch = Median(launch);
  result.step_copies = Median(step_copies);
  result.launch_copies = Median(launch_copies);
  for (double* v : {&result.compute, &result.communication, &result.step, &result.launch,
                    &result.step_copies, &result.launch_copies}) {
    MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }
  for (float* p : own) cudaFree(p);
  for (cudaEvent_t e : reduced) cudaEventDestroy(e);
  for (cudaEvent_t e : layer_done) cudaEventDestroy(e);
  for (float* p : buckets.flat) cudaFree(p);
  cudaStreamDestroy(comm);
  cudaStreamDestroy(compute);
  ncclCommDestroy(nccl);
  return result;
}

}  // namespace gradsync_bench
