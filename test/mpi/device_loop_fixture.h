// The device loop tests' fixture (device_loop_test.cc, device_loop_gpu_test.cc): the process
// sets' device planes made over the host backend (SetDevicePlaneFactoryForTesting), "device"
// tensors that are host memory labelled cuda:N, and what the tests read back.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "ops/device/device_plane.h"
#include "ops/device/device_plane_factory.h"
#include "ops/device/host_device_backend.h"
#include "test/mpi/multi_rank_test.h"
#include "test/trace_reader.h"

namespace gradsync {
namespace testing {

// Set on every rank before the same step: that step's first device allreduce fails at its
// launch, as a backend's refusal does, before anything is exchanged.
inline std::atomic<bool> fail_next_allreduce{false};

class FailingOncePlane : public DevicePlane {
 public:
  using DevicePlane::DevicePlane;
  Status Allreduce(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) override {
    if (fail_next_allreduce.exchange(false)) return Status::Internal("injected launch failure");
    return DevicePlane::Allreduce(entries, spec);
  }
};

// The devices this rank's planes were made for.
inline std::vector<Device> planes_made_for;

inline Status HostBackedPlane(const Config& config, MPI_Comm comm, const Device& device,
                              std::unique_ptr<DataPlane>* plane) {
  planes_made_for.push_back(device);
  std::unique_ptr<HostDeviceBackend> backend;
  GRADSYNC_RETURN_IF_ERROR(HostDeviceBackend::Create(comm, &backend));
  *plane =
      std::make_unique<FailingOncePlane>(std::move(backend), comm, DeviceCompletionTimeout(config));
  return Status::OK();
}

class DeviceLoopTest : public MultiRankTest {
 protected:
  void SetUp() override {
    SetDevicePlaneFactoryForTesting(&HostBackedPlane);
    MultiRankTest::SetUp();
  }
  void TearDown() override {
    MultiRankTest::TearDown();
    SetDevicePlaneFactoryForTesting(nullptr);
  }
};

// A host tensor relabelled as a device tensor.
inline TensorView OnDevice(HostTensor* tensor, int gpu = 0) {
  TensorView view = tensor->view();
  view.device = Device::Cuda(gpu);
  return view;
}

inline Allocator IntoDevice(std::unique_ptr<HostTensor>* out) { return Into(out); }

// How often the timeline shows the global set's schedule locking.
inline size_t LocksOfTheGlobalSet(const Trace& trace) {
  size_t locks = 0;
  for (const Json& e : trace.events) {
    if (StringField(e, "ph") == "i" && StringField(e, "name").rfind("LOCK set 0", 0) == 0) ++locks;
  }
  return locks;
}

}  // namespace testing
}  // namespace gradsync
