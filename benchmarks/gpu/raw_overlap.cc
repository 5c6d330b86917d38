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
  std::vector<float*> flat;       // one allocation a bucket
  std::vector<int64_t> elements;  // each bucket's float count
  std::vector<float*> gradient;   // each gradient's view into its bucket
  std::vector<int> closes;        // per gradient: the bucket its layer completes, or -1
};

Buckets MakeBuckets(const std::vector<int64_t>& counts, int64_t bucket_bytes) {
  Buckets b;
  b.gradient.resize(counts.size());
  b.closes.assign(counts.size(), -1);
  std::vector<std::vector<size_t>> members;
  int64_t bytes = bucket_bytes;  // a bucket is opened by the first gradient
  for (size_t i = counts.size(); i-- > 0;) {
    if (bytes >= bucket_bytes) {
      members.emplace_back();
      b.elements.push_back(0);
      bytes = 0;
    }
    members.back().push_back(i);
    b.elements.back() += counts[i];
    bytes += counts[i] * static_cast<int64_t>(sizeof(float));
  }
  for (size_t k = 0; k < members.size(); ++k) {
    float* flat = nullptr;
    CHECK_CUDA(cudaMalloc(&flat, static_cast<size_t>(b.elements[k]) * sizeof(float)));
    b.flat.push_back(flat);
    int64_t offset = 0;
    for (size_t i : members[k]) {
      b.gradient[i] = flat + offset;
      offset += counts[i];
    }
    b.closes[members[k].back()] = static_cast<int>(k);  // the last produced
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
  auto reduce = [&](size_t k) {
    CHECK_NCCL(ncclAllReduce(buckets.flat[k], buckets.flat[k],
                             static_cast<size_t>(buckets.elements[k]), ncclFloat32, ncclSum, nccl,
                             comm));
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
  std::vector<double> compute_alone, comm_alone, step, launch;
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
    if (i < 2) continue;  // warm-up
    compute_alone.push_back(c);
    comm_alone.push_back(m);
    step.push_back(s);
    launch.push_back(l);
  }
  RawOverlap result;
  result.buckets = static_cast<int>(buckets.flat.size());
  result.compute = Median(compute_alone);
  result.communication = Median(comm_alone);
  result.step = Median(step);
  result.launch = Median(launch);
  for (double* v : {&result.compute, &result.communication, &result.step, &result.launch}) {
    MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }
  for (cudaEvent_t e : layer_done) cudaEventDestroy(e);
  for (float* p : buckets.flat) cudaFree(p);
  cudaStreamDestroy(comm);
  cudaStreamDestroy(compute);
  ncclCommDestroy(nccl);
  return result;
}

}  // namespace gradsync_bench
