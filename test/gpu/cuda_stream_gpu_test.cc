// CudaStream and CudaEvent on a device: a consumer stream runs after a slow producer kernel
// without the host waiting, the framework's stream is ordered after the reduction's event, a wait
// on work stuck behind a producer times out, and an abort fails the stuck event and later ones.
// Host C++: the kernels it launches are in gpu_test_kernels.cu, so that GoogleTest's macros are
// compiled by the host compiler alone (nvcc's front end warns on what they generate).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "ops/cuda/cuda_stream.h"
#include "ops/device/device_events.h"
#include "test/gpu/gpu_test_kernels.h"

namespace gradsync {
namespace {

constexpr std::chrono::seconds kLong(30);
constexpr std::chrono::milliseconds kShort(50);

struct Memory {
  int* release = nullptr;         // mapped host memory the kernel polls
  int* release_device = nullptr;  // its device alias
  int* a = nullptr;
  int* b = nullptr;
  Memory() {
    EXPECT_EQ(cudaSuccess, cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
    *release = 0;
    EXPECT_EQ(cudaSuccess, cudaHostGetDevicePointer(&release_device, release, 0));
    EXPECT_EQ(cudaSuccess, cudaMalloc(&a, sizeof(int)));
    EXPECT_EQ(cudaSuccess, cudaMalloc(&b, sizeof(int)));
    EXPECT_EQ(cudaSuccess, cudaMemset(a, 0, sizeof(int)));
    EXPECT_EQ(cudaSuccess, cudaMemset(b, 0, sizeof(int)));
  }
  ~Memory() {
    cudaDeviceSynchronize();
    cudaFree(a);
    cudaFree(b);
    cudaFreeHost(release);
  }
  int Read(const int* p) {
    int v = -1;
    EXPECT_EQ(cudaSuccess, cudaMemcpy(&v, p, sizeof(int), cudaMemcpyDeviceToHost));
    return v;
  }
};

TEST(CudaStreamTest, ConsumerRunsAfterTheProducerWithoutTheHostWaiting) {
  std::unique_ptr<CudaStream> producer, consumer;
  ASSERT_TRUE(CudaStream::Create(0, &producer).ok());
  ASSERT_TRUE(CudaStream::Create(0, &consumer).ok());
  Memory m;
  testing::LaunchWaitThenWrite(producer->native(), m.release_device, m.a, 42);
  consumer->WaitFor(producer->Record());
  testing::LaunchCopyInt(consumer->native(), m.a, m.b);
  std::shared_ptr<StreamEvent> done = consumer->Record();
  // Everything above returned while the producer still spins.
  EXPECT_FALSE(done->Query());
  EXPECT_EQ(StatusCode::kTimeout, done->Wait(kShort).code());
  *reinterpret_cast<volatile int*>(m.release) = 1;
  ASSERT_TRUE(done->Wait(kLong).ok());
  EXPECT_EQ(42, m.Read(m.b));
}

// The enqueue records readiness on this handle itself (RecordAtEnqueue), never a locked cycle on
// another thread.
TEST(CudaStreamTest, ThePerThreadStreamHandleIsCudas) {
  EXPECT_EQ(PerThreadStreamHandle(), static_cast<void*>(cudaStreamPerThread));
}

TEST(CudaStreamTest, AbortFailsTheStuckEventAndLaterRecords) {
  std::unique_ptr<CudaStream> producer, communication;
  ASSERT_TRUE(CudaStream::Create(0, &producer).ok());
  ASSERT_TRUE(CudaStream::Create(0, &communication).ok());
  Memory m;
  testing::LaunchWaitThenWrite(producer->native(), m.release_device, m.a, 7);
  communication->WaitFor(producer->Record());
  std::shared_ptr<StreamEvent> stuck = communication->Record();
  EXPECT_EQ(StatusCode::kTimeout, stuck->Wait(kShort).code());
  communication->Abort(Status::Timeout("allreduce of 'w' did not finish within 1 s"));
  EXPECT_EQ(StatusCode::kTimeout, stuck->Wait(kLong).code());
  EXPECT_NE(std::string::npos, stuck->Wait(kLong).ToString().find("allreduce of 'w'"));
  EXPECT_EQ(StatusCode::kTimeout, communication->Record()->Wait(kLong).code());
  *reinterpret_cast<volatile int*>(m.release) = 1;  // let the kernel end before freeing
}

// A bucket the finalizer saw complete, then a later bucket's deadline aborts the stream: the
// first stays a success, as on the host stream, instead of failing a sound result.
TEST(CudaStreamTest, AnEventSeenCompleteBeforeAnAbortStaysComplete) {
  std::unique_ptr<CudaStream> communication;
  ASSERT_TRUE(CudaStream::Create(0, &communication).ok());
  std::shared_ptr<StreamEvent> done = communication->Record();
  ASSERT_TRUE(done->Wait(kLong).ok());
  communication->Abort(Status::Timeout("a later bucket did not finish"));
  EXPECT_TRUE(done->Wait(std::chrono::nanoseconds(0)).ok());
  EXPECT_EQ(StatusCode::kTimeout, communication->Record()->Wait(kLong).code());
}

}  // namespace
}  // namespace gradsync
