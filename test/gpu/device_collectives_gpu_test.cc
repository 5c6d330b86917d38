// gradsync's public API on CUDA tensors: every collective, fused and alone, views of one
// allocation reduced where they lie, fp16/bf16, process sets, a slow producer ordered through
// DeviceReadiness, stream-ordered completion, and a producer that never finishes ending in the
// timeout error. Run at world size 1 through NCCL, and at 2 and 4 ranks sharing one GPU through the
// MPI backend (GRADSYNC_GPU_BACKEND=mpi). Run at 2 ranks with GRADSYNC_GPU_BACKEND=nccl it checks
// the shared-GPU error instead. Skipped without a device.
#include <cuda_runtime.h>
#include <gradsync/gradsync.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/half.h"
#include "test/gpu/gpu_test_kernels.h"
#include "test/trace_reader.h"

namespace gradsync {
namespace testing {
namespace {

constexpr std::chrono::seconds kLimit(120);

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Asked of MPI, not of gradsync: under this setting init() itself refuses to start.
bool NcclSharingOneGpu() {
  const char* backend = std::getenv("GRADSYNC_GPU_BACKEND");
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return backend != nullptr && std::string(backend) == "nccl" && world > 1;
}

// Device memory holding floats, filled and read through the host.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) : n_(n) { cudaMalloc(&data_, n * sizeof(float) + 1); }
  ~DeviceFloats() { cudaFree(data_); }
  void Set(const std::vector<float>& values) {
    cudaMemcpy(data_, values.data(), n_ * sizeof(float), cudaMemcpyHostToDevice);
  }
  std::vector<float> Get() const {
    std::vector<float> out(n_);
    cudaMemcpy(out.data(), data_, n_ * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }
  TensorView view() {
    return TensorView(data_, DataType::kFloat32, {static_cast<int64_t>(n_)}, Device::Cuda(0));
  }
  float* data() { return static_cast<float*>(data_); }

 private:
  size_t n_;
  void* data_ = nullptr;
};

// Outputs the collectives allocate, in device memory freed at the end of the test.
struct DeviceOutputs {
  std::vector<void*> blocks;
  ~DeviceOutputs() {
    for (void* p : blocks) cudaFree(p);
  }
  Allocator Allocate() {
    return [this](const std::vector<int64_t>& shape, DataType dtype) -> void* {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      void* p = nullptr;
      if (cudaMalloc(&p, n * DataTypeSize(dtype) + 1) != cudaSuccess) return nullptr;
      blocks.push_back(p);
      return p;
    };
  }
};

class DeviceCollectivesTest : public ::testing::Test {
 protected:
  // MPI outlives every test (gpu_test_main initializes it), so each test has an init() of its own.
  void SetUp() override {
    cudaSetDevice(0);
    if (NcclSharingOneGpu()) return;  // the test that runs checks init()'s refusal itself
    init();
    rank_ = gradsync::rank();
    size_ = gradsync::size();
  }
  void TearDown() override {
    if (is_initialized()) shutdown();
  }
  int rank_ = 0;
  int size_ = 1;
};

TEST_F(DeviceCollectivesTest, AllreduceFusedAndAloneWithEveryOp) {
  if (NcclSharingOneGpu()) GTEST_SKIP() << "the shared-GPU error is checked instead";
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    std::vector<std::unique_ptr<DeviceFloats>> tensors;
    std::vector<Handle> handles;
    // The last is over the 25 MiB of a device bucket, so it is reduced alone, in place.
    for (size_t n : {1, 3, 4097, 300000, 7000000}) {
      tensors.push_back(std::make_unique<DeviceFloats>(n));
      tensors.back()->Set(std::vector<float>(n, static_cast<float>(rank_ + 1)));
      AllreduceOptions options;
      options.op = op;
      options.name = "ar." + ReduceOpName(op) + "." + std::to_string(n);
      handles.push_back(allreduce(tensors.back()->view(), options));
    }
    for (Handle& h : handles) ASSERT_TRUE(h.wait_for(kLimit));
    double sum = 0, product = 1;
    for (int r = 1; r <= size_; ++r) {
      sum += r;
      product *= r;
    }
    const double expected = op == ReduceOp::kSum       ? sum
                            : op == ReduceOp::kAverage ? sum / size_
                            : op == ReduceOp::kMin     ? 1
                            : op == ReduceOp::kMax     ? size_
                                                       : product;
    for (auto& t : tensors) {
      for (float v : t->Get()) ASSERT_FLOAT_EQ(v, expected) << ReduceOpName(op);
    }
  }
}

// A handle that completes says the results are in device memory: read at once on another stream,
// with nothing ordering that read after gradsync's stream, a fused bucket's outputs hold the
// reduced and scaled values, not what the copy out had yet to overwrite. The bucket is big (24 MiB
// in 64 tensors) so that its copy out takes a while; ranks sharing the GPU take turns on it, which
// makes the copy out later still. The MPI backend queues that copy without waiting for it and
// waits only before its completion event: a completion recorded without that wait fails here.
TEST_F(DeviceCollectivesTest, AHandleCompletesOnlyOnceItsFusedOutputsAreOnTheDevice) {
  if (NcclSharingOneGpu()) GTEST_SKIP();
  constexpr size_t kTensors = 64;
  constexpr size_t kElements = 96 * 1024;
  std::vector<std::unique_ptr<DeviceFloats>> tensors;
  for (size_t i = 0; i < kTensors; ++i)
    tensors.push_back(std::make_unique<DeviceFloats>(kElements));
  const float expected = 3.0f * static_cast<float>(size_ * (size_ + 1) / 2);
  for (int step = 0; step < 4; ++step) {
    for (auto& t : tensors) t->Set(std::vector<float>(kElements, static_cast<float>(rank_ + 1)));
    std::vector<Handle> handles;
    for (size_t i = 0; i < kTensors; ++i) {
      AllreduceOptions options;
      options.name = "settled." + std::to_string(i);
      options.postscale = 3.0;
      handles.push_back(allreduce(tensors[i]->view(), options));
    }
    for (Handle& h : handles) ASSERT_TRUE(h.wait_for(kLimit));
    for (size_t i = 0; i < kTensors; ++i) {
      const std::vector<float> values = tensors[i]->Get();
      ASSERT_EQ(values.front(), expected) << "tensor " << i << ", step " << step;
      ASSERT_EQ(values.back(), expected) << "tensor " << i << ", step " << step;
    }
  }
}

TEST_F(DeviceCollectivesTest, HalfPrecisionWithScales) {
  if (NcclSharingOneGpu()) GTEST_SKIP();
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    const int n = 1000;
    std::vector<uint16_t> host(n);
    for (int i = 0; i < n; ++i) {
      host[i] = dtype == DataType::kFloat16 ? FloatToHalf(1.5f) : FloatToBFloat16(1.5f);
    }
    void* data = nullptr;
    CUDA_OK(cudaMalloc(&data, n * 2));
    CUDA_OK(cudaMemcpy(data, host.data(), n * 2, cudaMemcpyHostToDevice));
    AllreduceOptions options;
    options.op = ReduceOp::kAverage;
    options.prescale = 2.0;
    options.postscale = 0.5;
    ASSERT_TRUE(allreduce(TensorView(data, dtype, {n}, Device::Cuda(0)), options).wait_for(kLimit));
    CUDA_OK(cudaMemcpy(host.data(), data, n * 2, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      const float v = dtype == DataType::kFloat16 ? HalfToFloat(host[i]) : BFloat16ToFloat(host[i]);
      ASSERT_NEAR(v, 1.5f, 0.01f);
    }
    cudaFree(data);
  }
}

TEST_F(DeviceCollectivesTest, GatherBroadcastScatterAndAlltoall) {
  if (NcclSharingOneGpu()) GTEST_SKIP();
  DeviceOutputs outputs;
  DeviceFloats mine(rank_ + 1);
  mine.Set(std::vector<float>(rank_ + 1, static_cast<float>(rank_)));
  Handle gathered =
      allgather(TensorView(mine.data(), DataType::kFloat32, {rank_ + 1}, Device::Cuda(0)),
                outputs.Allocate());
  ASSERT_TRUE(gathered.wait_for(kLimit));
  EXPECT_EQ(gathered.output_shape(), std::vector<int64_t>{size_ * (size_ + 1) / 2});

  DeviceFloats root_value(8);
  root_value.Set(std::vector<float>(8, rank_ == 0 ? 42.0f : -1.0f));
  ASSERT_TRUE(broadcast(root_value.view(), 0).wait_for(kLimit));
  for (float v : root_value.Get()) EXPECT_EQ(v, 42.0f);

  DeviceFloats rows(size_ * 4);
  rows.Set(std::vector<float>(size_ * 4, 1.0f));
  Handle scattered =
      reducescatter(TensorView(rows.data(), DataType::kFloat32, {size_ * 2, 2}, Device::Cuda(0)),
                    outputs.Allocate());
  ASSERT_TRUE(scattered.wait_for(kLimit));
  EXPECT_EQ(scattered.output_shape(), (std::vector<int64_t>{2, 2}));

  DeviceFloats sent(size_);
  sent.Set(std::vector<float>(size_, static_cast<float>(rank_)));
  Handle exchanged = alltoall(sent.view(), outputs.Allocate());
  ASSERT_TRUE(exchanged.wait_for(kLimit));
  EXPECT_EQ(exchanged.received_splits(), std::vector<int64_t>(size_, 1));
  ASSERT_TRUE(barrier("gpu.barrier").wait_for(kLimit));
}

// Rank 0's allocator gives no memory: its allgather fails there alone, and only once the device
// has run the collective it still took part in, which reads the input behind a held producer.
TEST_F(DeviceCollectivesTest, AnOutputNotAllocatedFailsOnceTheDeviceIsDoneWithTheInput) {
  if (NcclSharingOneGpu()) GTEST_SKIP();
  cudaStream_t producer = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  int* release = nullptr;
  CUDA_OK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
  *release = 0;
  DeviceOutputs outputs;
  DeviceFloats mine(1000);
  LaunchSlowFill(producer, release, mine.data(), 1000, static_cast<float>(rank_), 20000000000LL);
  AllgatherOptions options;
  options.ready.cuda_stream = producer;
  const Allocator refuses = [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; };
  Handle gathered = allgather(mine.view(), rank_ == 0 ? refuses : outputs.Allocate(), options);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(gathered.poll()) << "completed while the producer still held the input";
  *release = 1;
  if (rank_ == 0) {
    EXPECT_THROW(gathered.wait_for(kLimit), Error);
    EXPECT_EQ(gathered.status().code(), StatusCode::kInvalidArgument);
  } else {
    ASSERT_TRUE(gathered.wait_for(kLimit));
  }
  CUDA_OK(cudaStreamSynchronize(producer));
  cudaFreeHost(release);
  cudaStreamDestroy(producer);
}

TEST_F(DeviceCollectivesTest, ProcessSetOfEveryOtherRank) {
  if (NcclSharingOneGpu()) GTEST_SKIP();
  if (size_ == 1) GTEST_SKIP() << "at 1 rank, every other rank is the global set";
  std::vector<int> evens;
  for (int r = 0; r < size_; r += 2) evens.push_back(r);
  ProcessSet set = add_process_set(evens);
  if (set.included()) {
    DeviceFloats t(100);
    t.Set(std::vector<float>(100, 1.0f));
    AllreduceOptions options;
    options.process_set = set;
    ASSERT_TRUE(allreduce(t.view(), options).wait_for(kLimit));
    for (float v : t.Get()) EXPECT_EQ(v, static_cast<float>(evens.size()));
  }
  remove_process_set(set);
}

TEST_F(DeviceCollectivesTest, SlowProducerAndStreamOrderedCompletion) {
  if (NcclSharingOneGpu()) GTEST_SKIP();
  cudaStream_t producer = nullptr;
  cudaStream_t consumer = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  int* release = nullptr;
  CUDA_OK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
  *release = 0;
  const size_t n = 1 << 20;
  DeviceFloats grad(n);
  DeviceFloats seen(n);
  grad.Set(std::vector<float>(n, -100.0f));
  // The producer spins for up to half a second before writing the gradient.
  LaunchSlowFill(producer, release, grad.data(), n, static_cast<float>(rank_ + 1), 500000000LL);
  AllreduceOptions options;
  options.ready.cuda_stream = producer;
  Handle h = allreduce(grad.view(), options);
  // Stream-ordered: the consumer copies the result without the host waiting for it.
  h.synchronize_stream(consumer);
  CUDA_OK(cudaMemcpyAsync(seen.data(), grad.data(), n * sizeof(float), cudaMemcpyDeviceToDevice,
                          consumer));
  CUDA_OK(cudaStreamSynchronize(consumer));
  const float expected = static_cast<float>(size_ * (size_ + 1) / 2);
  for (float v : seen.Get()) ASSERT_EQ(v, expected);
  ASSERT_TRUE(h.wait_for(kLimit));
  cudaFreeHost(release);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

// DistributedOptimizer's path: a batch whose device tensors start from hooks with their
// producer's stream as readiness, finished with synchronize_stream. Through NCCL the host never
// waits for the producer: start() and synchronize_stream() both return while it still spins, and
// only then is it released. (The MPI backend stages through the host, so its finish waits.)
TEST_F(DeviceCollectivesTest, BatchStartsAndFinishesWithoutWaitingForTheProducer) {
  if (NcclSharingOneGpu()) GTEST_SKIP();
  const char* backend = std::getenv("GRADSYNC_GPU_BACKEND");
  const bool staged_through_host = backend != nullptr && std::string(backend) == "mpi";
  cudaStream_t producer = nullptr;
  cudaStream_t consumer = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  int* release = nullptr;
  CUDA_OK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
  const std::vector<size_t> counts = {1, 300, 1 << 18};
  std::vector<std::unique_ptr<DeviceFloats>> grads;
  std::vector<TensorView> views;
  for (size_t n : counts) {
    grads.push_back(std::make_unique<DeviceFloats>(n));
    views.push_back(grads.back()->view());
  }
  AllreduceBatchOptions options;
  options.names = {"batch.slow.0", "batch.slow.1", "batch.slow.2"};
  options.op = ReduceOp::kAverage;
  AllreduceBatch batch(views, options);
  DeviceReadiness ready;
  ready.cuda_stream = producer;
  for (int step = 0; step < 3; ++step) {
    *release = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      grads[i]->Set(std::vector<float>(counts[i], -100.0f));
      // Up to 20 s of spinning, released below: far longer than any launch takes.
      LaunchSlowFill(producer, release, grads[i]->data(), static_cast<long long>(counts[i]),
                     static_cast<float>(rank_ + step), 20000000000LL);
      batch.start(i, grads[i]->data(), ready);
    }
    EXPECT_EQ(cudaStreamQuery(producer), cudaErrorNotReady) << "start() waited for the producer";
    if (!staged_through_host) {
      batch.synchronize_stream(consumer);
      EXPECT_EQ(cudaStreamQuery(producer), cudaErrorNotReady)
          << "synchronize_stream() waited for the producer";
      *release = 1;
    } else {
      *release = 1;
      batch.synchronize_stream(consumer);
    }
    CUDA_OK(cudaStreamSynchronize(consumer));
    const float expected = static_cast<float>(step) + static_cast<float>(size_ - 1) / 2.0f;
    for (size_t i = 0; i < counts.size(); ++i) {
      for (float v : grads[i]->Get()) ASSERT_EQ(v, expected) << "tensor " << i << " step " << step;
    }
  }
  cudaFreeHost(release);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

// The timeline draws a CUDA bucket's phases on the stream from timed events, in order and one
// after the other, on rank 0's rows.
TEST_F(DeviceCollectivesTest, TimelineShowsTheBucketsPhasesOnTheDevice) {
  if (NcclSharingOneGpu()) GTEST_SKIP() << "the shared-GPU error is checked instead";
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("gradsync_gpu_timeline_" + std::to_string(rank_) + ".json");
  start_timeline(path.string());
  std::vector<std::unique_ptr<DeviceFloats>> tensors;
  std::vector<TensorView> views;
  GroupedAllreduceOptions options;
  for (int i = 0; i < 4; ++i) {
    tensors.push_back(std::make_unique<DeviceFloats>(1000));
    tensors.back()->Set(std::vector<float>(1000, 1.0f));
    views.push_back(tensors.back()->view());
    options.names.push_back("gpu.tl." + std::to_string(i));
  }
  for (const Handle& h : grouped_allreduce(views, options)) ASSERT_TRUE(h.wait_for(kLimit));
  stop_timeline();
  if (rank_ != 0) return;
  const testing::Trace trace = testing::LoadTrace(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(trace.ok);
  const int64_t row = trace.RowOf("gpu.tl.1");
  std::vector<std::string> phases;
  int64_t last_end = -1;
  for (const testing::Json& e : trace.events) {
    if (testing::IntField(e, "tid") != row || testing::StringField(e, "ph") != "X") continue;
    phases.push_back(testing::StringField(e, "name"));
    EXPECT_GE(testing::IntField(e, "ts"), last_end - 1) << phases.back();
    last_end = testing::IntField(e, "ts") + testing::IntField(e, "dur");
  }
  EXPECT_EQ(phases, (std::vector<std::string>{"DEVICE_QUEUE", "DEVICE_COPY_IN", "DEVICE_ALLREDUCE",
                                              "DEVICE_COPY_OUT"}));
}

// Views into one allocation, back to back in the group's order (a flat gradient buffer), are
// reduced where they lie: the timeline shows no copy, the results are right, and the elements
// after the last view are left as they were.
TEST_F(DeviceCollectivesTest, ViewsBackToBackInOneAllocationAreReducedWhereTheyLie) {
  if (NcclSharingOneGpu()) GTEST_SKIP() << "the shared-GPU error is checked instead";
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("gradsync_gpu_views_" + std::to_string(rank_) + ".json");
  start_timeline(path.string());
  const std::vector<int64_t> counts{1000, 4096, 64, 333};
  DeviceFloats flat(1000 + 4096 + 64 + 333 + 16);
  std::vector<float> values(1000 + 4096 + 64 + 333 + 16, -7.0f);
  GroupedAllreduceOptions options;
  std::vector<TensorView> views;
  int64_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    for (int64_t e = 0; e < counts[i]; ++e) values[at + e] = static_cast<float>(rank_ + 1 + e % 5);
    views.push_back(TensorView(flat.data() + at, DataType::kFloat32, {counts[i]}, Device::Cuda(0)));
    options.names.push_back("gpu.views." + std::to_string(i));
    at += counts[i];
  }
  flat.Set(values);
  for (const Handle& h : grouped_allreduce(views, options)) ASSERT_TRUE(h.wait_for(kLimit));
  stop_timeline();
  const std::vector<float> reduced = flat.Get();
  at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    for (int64_t e = 0; e < counts[i]; ++e) {
      const float expected = static_cast<float>(size_ * (size_ + 1) / 2 + size_ * (e % 5));
      ASSERT_EQ(reduced[at + e], expected) << "view " << i << " element " << e;
    }
    at += counts[i];
  }
  for (size_t e = at; e < reduced.size(); ++e) ASSERT_EQ(reduced[e], -7.0f) << "element " << e;
  if (rank_ != 0) return;
  const testing::Trace trace = testing::LoadTrace(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(trace.ok);
  const int64_t row = trace.RowOf("gpu.views.1");
  std::vector<std::string> phases;
  for (const testing::Json& e : trace.events) {
    if (testing::IntField(e, "tid") == row && testing::StringField(e, "ph") == "X") {
      phases.push_back(testing::StringField(e, "name"));
    }
  }
  EXPECT_EQ(phases, (std::vector<std::string>{"DEVICE_QUEUE", "DEVICE_ALLREDUCE"}));
}

TEST_F(DeviceCollectivesTest, NcclRefusesRanksSharingOneGpu) {
  if (!NcclSharingOneGpu()) GTEST_SKIP() << "needs GRADSYNC_GPU_BACKEND=nccl and 2 ranks";
  // The launch check refuses at init(), on every rank, before any tensor is queued.
  try {
    init();
    FAIL() << "init() accepted two NCCL ranks on one GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("the same GPU"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GRADSYNC_GPU_BACKEND=mpi"), std::string::npos);
  }
  EXPECT_FALSE(is_initialized());
}

// Last: it aborts the plane. A producer that never finishes (until released after the check).
// Through the MPI backend only: released later, the producer would let NCCL kernels queued behind
// it run on the aborted communicator, which leaves the device in no state for the next test.
TEST_F(DeviceCollectivesTest, NeverFinishingProducerEndsInTheTimeoutError) {
  const char* backend = std::getenv("GRADSYNC_GPU_BACKEND");
  if (backend == nullptr || std::string(backend) != "mpi") {
    GTEST_SKIP() << "runs with GRADSYNC_GPU_BACKEND=mpi";
  }
  shutdown();
  setenv("GRADSYNC_NCCL_TIMEOUT_SECONDS", "2", 1);
  init();
  cudaStream_t producer = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  int* release = nullptr;
  CUDA_OK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
  *release = 0;
  DeviceFloats grad(1024);
  LaunchSlowFill(producer, release, grad.data(), 1024, 1.0f, 1LL << 62);
  AllreduceOptions options;
  options.name = "never.ready";
  options.ready.cuda_stream = producer;
  Handle h = allreduce(grad.view(), options);
  try {
    h.wait_for(kLimit);
    ADD_FAILURE() << "completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("never.ready"), std::string::npos) << e.what();
  }
  *release = 1;  // let the device drain before shutdown
  cudaStreamSynchronize(producer);
  unsetenv("GRADSYNC_NCCL_TIMEOUT_SECONDS");
  cudaFreeHost(release);
  cudaStreamDestroy(producer);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
