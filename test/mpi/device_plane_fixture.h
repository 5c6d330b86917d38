// The device plane over the host backend as device_plane_test's cases use it: one operation as
// the background thread holds it, and a fixture that makes the plane over every rank.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ops/device/device_plane.h"
#include "ops/device/host_device_backend.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {

// One operation as the background thread holds it: the entry, its handle's state and its input.
struct Op {
  Op(const std::string& name, DataType dtype, std::vector<int64_t> shape)
      : input(dtype, shape), result(dtype, shape) {
    entry.name = name;
    entry.input = input.view();
    entry.output = entry.input;
    entry.state = std::make_shared<OpState>();
  }
  // The reduction writes into `result` instead of the input.
  void OutOfPlace() { entry.output = result.view(); }

  TensorEntry entry;
  HostTensor input;
  HostTensor result;
};

class DevicePlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MakePlane(std::chrono::seconds(60));
  }
  void TearDown() override {
    plane_.reset();
    int failed_here = HasFailure() ? 1 : 0;
    int failed_anywhere = 0;
    MPI_Allreduce(&failed_here, &failed_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (failed_anywhere && !failed_here) ADD_FAILURE() << "this test failed on another rank";
  }

  void MakePlane(std::chrono::nanoseconds timeout,
                 std::chrono::nanoseconds stuck_limit = kWaitForever) {
    plane_.reset();
    std::unique_ptr<HostDeviceBackend> backend;
    ASSERT_TRUE(HostDeviceBackend::Create(MPI_COMM_WORLD, &backend, stuck_limit).ok());
    backend_ = backend.get();
    plane_ = std::make_unique<DevicePlane>(std::move(backend), MPI_COMM_WORLD, timeout);
  }

  // Waits for the launch's completion event, as the finalizer would.
  Status Finish() {
    std::shared_ptr<StreamEvent> done = plane_->TakeCompletion();
    if (done == nullptr) return Status::Internal("no completion event");
    return done->Wait(kWaitLimit);
  }

  int rank_ = 0;
  int size_ = 1;
  HostDeviceBackend* backend_ = nullptr;
  std::unique_ptr<DevicePlane> plane_;
};

// The labels of a launch's recorded phases, in order.
inline std::vector<std::string> Labels(const std::vector<DataPlane::TimedPhase>& phases) {
  std::vector<std::string> labels;
  for (const DataPlane::TimedPhase& phase : phases) labels.push_back(phase.label);
  return labels;
}

inline void Fill(HostTensor* tensor, ReduceOp op, int rank) {
  for (int64_t i = 0; i < tensor->size(); ++i) tensor->Set(i, Value(op, rank, i));
}

inline ::testing::AssertionResult Reduced(const HostTensor& tensor, ReduceOp op, DataType dtype,
                                          int size, double scale = 1.0) {
  for (int64_t i = 0; i < tensor.size(); ++i) {
    const double expected = Expected(op, dtype, size, i) * scale;
    if (std::abs(tensor.Get(i) - expected) > Tolerance(dtype, expected)) {
      return ::testing::AssertionFailure()
             << DataTypeName(dtype) << " " << ReduceOpName(op) << " element " << i << ": "
             << tensor.Get(i) << ", wanted " << expected;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing
}  // namespace gradsync
