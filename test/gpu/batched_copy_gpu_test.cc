// The batched copy kernel on a device gives the bits of the host executor, which the unit tests
// check against the host kernels: every data type, scaled and not, aligned and not, many tensors
// in one launch. CudaBatchedCopier keeps each launch's staged descriptors until its copy has run,
// however many launches wait behind a stalled stream, and so does it a repeated copy's table.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/batched_copy_kernel.h"
#include "ops/cuda/cuda_batched_copy.h"
#include "ops/device/batched_copy.h"
#include "ops/device/copy_table_cache.h"
#include "test/gpu/gpu_test_kernels.h"

namespace gradsync {
namespace {

#define ASSERT_CUDA(call)                                                        \
  do {                                                                           \
    const cudaError_t error = (call);                                            \
    ASSERT_EQ(cudaSuccess, error) << #call << ": " << cudaGetErrorString(error); \
  } while (0)

const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt32,
                              DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16,
                              DataType::kFloat32, DataType::kFloat64};

// Small random integers are valid values of every type, so no scaled NaN payload can differ.
std::vector<uint8_t> RandomValues(DataType dtype, int64_t count, std::mt19937* rng) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * DataTypeSize(dtype));
  std::uniform_int_distribution<int> value(-100, 100);
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* at = bytes.data() + static_cast<size_t>(i) * DataTypeSize(dtype);
    const int v = value(*rng);
    switch (dtype) {
      case DataType::kUInt8: {
        const uint8_t x = static_cast<uint8_t>(v + 100);
        std::memcpy(at, &x, 1);
        break;
      }
      case DataType::kInt8: {
        const int8_t x = static_cast<int8_t>(v);
        std::memcpy(at, &x, 1);
        break;
      }
      case DataType::kInt32: {
        const int32_t x = v;
        std::memcpy(at, &x, 4);
        break;
      }
      case DataType::kInt64: {
        const int64_t x = v;
        std::memcpy(at, &x, 8);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t x = FloatToHalf(v / 8.0f);
        std::memcpy(at, &x, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t x = FloatToBFloat16(v / 8.0f);
        std::memcpy(at, &x, 2);
        break;
      }
      case DataType::kFloat32: {
        const float x = v / 8.0f;
        std::memcpy(at, &x, 4);
        break;
      }
      case DataType::kFloat64: {
        const double x = v / 8.0;
        std::memcpy(at, &x, 8);
        break;
      }
    }
  }
  return bytes;
}

class BatchedCopyGpuTest : public ::testing::TestWithParam<DataType> {};

TEST_P(BatchedCopyGpuTest, MatchesTheHostExecutor) {
  const DataType dtype = GetParam();
  const size_t size = DataTypeSize(dtype);
  const int64_t per = ChunkElements(size);
  std::mt19937 rng(static_cast<unsigned>(dtype) + 1);
  for (double scale : {1.0, 0.25, 1.0 / 3.0}) {
    // Sizes around the chunk; source offsets that keep, break and differ in 16-byte alignment.
    const std::vector<int64_t> counts = {0, 1, 5, 33, per - 1, per, per + 1, 5 * per + 7};
    const std::vector<size_t> src_offsets = {0, size, 0, size, 0, 16, size, 0};
    const std::vector<size_t> dst_offsets = {0, size, size, 0, 0, 16, size, 16};
    std::vector<std::vector<uint8_t>> inputs;
    std::vector<size_t> src_at, dst_at;
    size_t src_bytes = 0, dst_bytes = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      inputs.push_back(RandomValues(dtype, counts[i], &rng));
      src_at.push_back((src_bytes + 255) / 256 * 256 + src_offsets[i]);
      dst_at.push_back((dst_bytes + 255) / 256 * 256 + dst_offsets[i]);
      src_bytes = src_at.back() + inputs.back().size();
      dst_bytes = dst_at.back() + inputs.back().size();
    }
    // The host reference, in host memory laid out like the device's.
    std::vector<uint8_t> host_src(src_bytes, 0), host_dst(dst_bytes, 0x5A);
    for (size_t i = 0; i < counts.size(); ++i) {
      if (!inputs[i].empty())
        std::memcpy(host_src.data() + src_at[i], inputs[i].data(), inputs[i].size());
    }
    std::vector<CopySegment> host_segments, device_segments;
    void* device_src = nullptr;
    void* device_dst = nullptr;
    ASSERT_CUDA(cudaMalloc(&device_src, src_bytes));
    ASSERT_CUDA(cudaMalloc(&device_dst, dst_bytes));
    ASSERT_CUDA(cudaMemcpy(device_src, host_src.data(), src_bytes, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemset(device_dst, 0x5A, dst_bytes));
    for (size_t i = 0; i < counts.size(); ++i) {
      host_segments.push_back(
          {host_src.data() + src_at[i], host_dst.data() + dst_at[i], counts[i], scale});
      device_segments.push_back({static_cast<char*>(device_src) + src_at[i],
                                 static_cast<char*>(device_dst) + dst_at[i], counts[i], scale});
    }
    ASSERT_TRUE(RunBatchedCopyOnHost(host_segments, dtype, 256).ok());

    const int n = static_cast<int>(device_segments.size());
    const std::vector<int64_t> plan = PlanCopyChunks(device_segments.data(), n, size);
    CopySegment* segments_on_device = nullptr;
    int64_t* plan_on_device = nullptr;
    ASSERT_CUDA(cudaMalloc(&segments_on_device, sizeof(CopySegment) * device_segments.size()));
    ASSERT_CUDA(cudaMalloc(&plan_on_device, sizeof(int64_t) * plan.size()));
    ASSERT_CUDA(cudaMemcpy(segments_on_device, device_segments.data(),
                           sizeof(CopySegment) * device_segments.size(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(plan_on_device, plan.data(), sizeof(int64_t) * plan.size(),
                           cudaMemcpyHostToDevice));
    cudaStream_t stream = nullptr;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const Status launched =
        LaunchBatchedCopy(segments_on_device, plan_on_device, n, plan.back(), dtype, stream);
    ASSERT_TRUE(launched.ok()) << launched.ToString();
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    std::vector<uint8_t> device_result(dst_bytes);
    ASSERT_CUDA(cudaMemcpy(device_result.data(), device_dst, dst_bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0, std::memcmp(device_result.data(), host_dst.data(), dst_bytes))
        << DataTypeName(dtype) << " scale " << scale;
    cudaStreamDestroy(stream);
    cudaFree(segments_on_device);
    cudaFree(plan_on_device);
    cudaFree(device_src);
    cudaFree(device_dst);
  }
}

// A stream that a producer kernel can stall until it is released (or for about 5 s), and device
// buffers, all freed after the test; a test's copier, a local, goes first, as it must.
class StalledStreamCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASSERT_CUDA(cudaHostAlloc(&release_, sizeof(int), cudaHostAllocMapped));
    ASSERT_CUDA(cudaMalloc(&blocker_, sizeof(float)));
  }
  void TearDown() override {
    for (float* buffer : buffers_) cudaFree(buffer);
    cudaFree(blocker_);
    cudaFreeHost(release_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // `count` floats of device memory; null (and the test failed) when there is none.
  float* DeviceFloats(size_t count) {
    float* buffer = nullptr;
    const cudaError_t error = cudaMalloc(&buffer, count * sizeof(float));
    EXPECT_EQ(cudaSuccess, error) << "cudaMalloc: " << cudaGetErrorString(error);
    if (error != cudaSuccess) return nullptr;
    buffers_.push_back(buffer);
    return buffer;
  }
  void Stall() {
    *release_ = 0;
    testing::LaunchSlowFill(stream_, release_, blocker_, 1, 0.0f, 10'000'000'000LL);
  }
  void Release() { *reinterpret_cast<volatile int*>(release_) = 1; }
  // Once the stream has run everything: `device` holds `expected`; `what` names a mismatch.
  void ExpectHolds(const float* device, const std::vector<float>& expected,
                   const std::function<std::string(size_t)>& what) {
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<float> held(expected.size());
    ASSERT_CUDA(
        cudaMemcpy(held.data(), device, held.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t k = 0; k < held.size(); ++k) ASSERT_EQ(expected[k], held[k]) << what(k);
  }

  cudaStream_t stream_ = nullptr;
  int* release_ = nullptr;
  float* blocker_ = nullptr;
  std::vector<float*> buffers_;
};

// A failed allocation that its caller handled (a copy table's, or a framework output's that the
// caller fails alone) stays the thread's last CUDA error: the next launch must not report it as
// its own, which would abort the whole plane.
TEST_F(StalledStreamCopyTest, AHandledAllocationFailureIsNotTheNextLaunchs) {
  float* source = DeviceFloats(4096);
  float* destination = DeviceFloats(4096);
  ASSERT_TRUE(source != nullptr && destination != nullptr);
  std::vector<float> values(4096, 3.0f);
  ASSERT_CUDA(cudaMemcpy(source, values.data(), 4096 * sizeof(float), cudaMemcpyHostToDevice));
  std::unique_ptr<CudaBatchedCopier> copier;
  ASSERT_TRUE(CudaBatchedCopier::Create(0, /*tables=*/false, &copier).ok());
  for (int segments : {1, InlineCopyPlan::kMaxSegments + 2}) {  // inline, then staged
    void* too_much = nullptr;
    ASSERT_NE(cudaSuccess, cudaMalloc(&too_much, size_t{1} << 60));
    std::vector<CopySegment> plan;
    for (int p = 0; p < segments; ++p) {
      const int64_t begin = 4096 * p / segments, end = 4096 * (p + 1) / segments;
      plan.push_back({source + begin, destination + begin, end - begin, 1.0});
    }
    const Status launched = copier->Launch(plan, DataType::kFloat32, stream_);
    ASSERT_TRUE(launched.ok()) << launched.ToString();
    ExpectHolds(destination, values, [](size_t k) { return "element " + std::to_string(k); });
  }
}

// Launches queued behind a producer that has not finished each take staging of their own: were a
// block reused before its copy ran, a later launch's descriptors would replace an earlier one's,
// and some destination would receive another's values. Then the same again with the stream free,
// so that finished blocks are reused.
TEST_F(StalledStreamCopyTest, DescriptorsOutliveLaunchesQueuedBehindAStalledStream) {
  constexpr int kLaunches = 200;
  constexpr int64_t kCount = 1000;
  float* sources = DeviceFloats(kLaunches * kCount);
  float* destinations = DeviceFloats(kLaunches * kCount);
  ASSERT_TRUE(sources != nullptr && destinations != nullptr);
  std::vector<float> values(static_cast<size_t>(kLaunches * kCount));
  std::unique_ptr<CudaBatchedCopier> copier;
  ASSERT_TRUE(CudaBatchedCopier::Create(0, /*tables=*/false, &copier).ok());
  // Rounds 0 and 1 launch plans that go inline as the kernel's parameter, 2 and 3 plans that go
  // through staging; the first of each behind a stalled stream. Round 0 is the first launch of
  // the copy kernels in this process: with CUDA's lazy loading, a kernel not loaded when the
  // copier was made blocked the host here until the producer gave up (5 s on an H200). Behind
  // the stall, inline plans are of 1 to 3 segments; round 1 runs every inline capacity.
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < kLaunches; ++i) {
      std::fill(values.begin() + i * kCount, values.begin() + (i + 1) * kCount,
                static_cast<float>(round * kLaunches + i));
    }
    ASSERT_CUDA(
        cudaMemcpy(sources, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice));
    // On the stream: the copies, on a non-blocking stream, would not wait for the legacy one.
    ASSERT_CUDA(cudaMemsetAsync(destinations, 0, values.size() * sizeof(float), stream_));
    const bool stalled = round % 2 == 0;
    if (stalled) Stall();
    const auto launches_began = std::chrono::steady_clock::now();
    for (int i = 0; i < kLaunches; ++i) {
      // One to three segments more or less from launch to launch, so that staged launches ask
      // for staging of different sizes.
      std::vector<CopySegment> segments;
      const int inline_pieces[] = {3, 17, InlineCopyPlan::kMaxSegments - 6};
      const int pieces = round == 0   ? 1 + i % 3
                         : round == 1 ? inline_pieces[i % 3]
                                      : InlineCopyPlan::kMaxSegments + 1 + i % 3;
      for (int p = 0; p < pieces; ++p) {
        const int64_t begin = kCount * p / pieces, end = kCount * (p + 1) / pieces;
        segments.push_back(
            {sources + i * kCount + begin, destinations + i * kCount + begin, end - begin, 1.0});
      }
      ASSERT_TRUE(copier->Launch(segments, DataType::kFloat32, stream_).ok());
    }
    if (stalled) {
      // The producer gives up after about 5 s: launches that blocked the host that long show here.
      const double launch_ms = std::chrono::duration<double, std::milli>(
                                   std::chrono::steady_clock::now() - launches_began)
                                   .count();
      std::printf("round %d: %d launches behind the stalled producer took %.1f ms\n", round,
                  kLaunches, launch_ms);
      EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(stream_))
          << "the producer should still spin; round " << round << "'s " << kLaunches
          << " launches took " << launch_ms << " ms";
      Release();
    }
    ExpectHolds(destinations, values, [&](size_t k) {
      return "round " + std::to_string(round) + ", element " + std::to_string(k);
    });
  }
}

// Repeated copies read their descriptors from tables. Every table here is uploaded behind a
// stalled stream, and more tables are made than the copier keeps, so that tables are retired
// while their uploads and the launches that read them still wait: a table's memory reused before
// then would carry another copy's descriptors, and some destination would not receive its values.
// The first half's first launches run before the stall and their destinations are cleared after
// them, so that only launches through tables fill those: theirs are the tables retired. (The
// second half's first launches, behind the stall, pass their descriptors inline, which fills
// their destinations whatever their tables hold: the copier remembers 64 copies, too few to
// launch all 80 once before the stall.)
TEST_F(StalledStreamCopyTest, TablesOfRepeatedCopiesOutliveLaunchesQueuedBehindAStalledStream) {
  constexpr int kCopies = 40;  // twice: more than the copier keeps, fewer than it remembers
  constexpr int kSegments = 24;
  constexpr int64_t kCount = 300;
  static_assert(2 * kCopies > static_cast<int>(CudaBatchedCopier::kTableCapacity), "none retired");
  static_assert(kCopies <= static_cast<int>(CopyTableCache::kRecentLists), "forgotten");
  constexpr int64_t kPerCopy = kSegments * kCount;
  constexpr size_t kFloats = 2 * kCopies * kPerCopy;
  float* sources = DeviceFloats(kFloats);
  float* destinations = DeviceFloats(kFloats);
  ASSERT_TRUE(sources != nullptr && destinations != nullptr);
  std::vector<float> values(kFloats);
  for (size_t k = 0; k < values.size(); ++k) values[k] = static_cast<float>(k % 100003);
  ASSERT_CUDA(cudaMemcpy(sources, values.data(), kFloats * sizeof(float), cudaMemcpyHostToDevice));
  std::unique_ptr<CudaBatchedCopier> copier;
  ASSERT_TRUE(CudaBatchedCopier::Create(0, /*tables=*/true, &copier).ok());
  // Copy c moves kSegments pieces of its share of `sources` to the same place in `destinations`.
  auto copy = [&](int c) {
    std::vector<CopySegment> segments;
    for (int p = 0; p < kSegments; ++p) {
      const int64_t at = c * kPerCopy + p * kCount;
      segments.push_back({sources + at, destinations + at, kCount, 1.0});
    }
    return segments;
  };
  // The first half's first launches, inline, run before the stall; their destinations are
  // cleared after them.
  for (int c = 0; c < kCopies; ++c) {
    ASSERT_TRUE(copier->Launch(copy(c), DataType::kFloat32, stream_).ok());
  }
  ASSERT_EQ(copier->tables(), 0u);
  ASSERT_CUDA(cudaMemsetAsync(destinations, 0, kFloats * sizeof(float), stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  Stall();
  // Behind the stall: the first half earn their tables and find them; the second half launch
  // once inline, then earn theirs and find them, retiring the first half's oldest tables.
  for (int round = 0; round < 2; ++round) {
    for (int c = 0; c < kCopies; ++c) {
      ASSERT_TRUE(copier->Launch(copy(c), DataType::kFloat32, stream_).ok());
    }
  }
  EXPECT_EQ(copier->tables(), static_cast<size_t>(kCopies));
  for (int round = 0; round < 2; ++round) {
    for (int c = kCopies; c < 2 * kCopies; ++c) {
      ASSERT_TRUE(copier->Launch(copy(c), DataType::kFloat32, stream_).ok());
    }
  }
  EXPECT_EQ(copier->tables(), CudaBatchedCopier::kTableCapacity);
  EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(stream_)) << "the producer should still spin";
  Release();
  ExpectHolds(destinations, values, [&](size_t k) {
    return "copy " + std::to_string(k / kPerCopy) + ", element " + std::to_string(k % kPerCopy);
  });
}

INSTANTIATE_TEST_SUITE_P(AllTypes, BatchedCopyGpuTest, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return DataTypeName(info.param); });

}  // namespace
}  // namespace gradsync
