// The locked schedule's end-to-end fixture: a training loop's steps over every rank, rank 0's
// timeline of LOCK and UNLOCK marks, and with GRADSYNC_TEST_DEVICE_TENSORS=1 device tensors over
// the host device backend (host memory labelled cuda:0), whose plane notes the thread of each
// allreduce launch. Shared by locked_schedule_test.cc and locked_unnamed_test.cc, one binary.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ops/device/device_events.h"
#include "ops/device/device_plane.h"
#include "ops/device/device_plane_factory.h"
#include "ops/device/host_device_backend.h"
#include "ops/device/producer_readiness.h"
#include "runtime/config.h"
#include "runtime/host_stream.h"
#include "test/mpi/multi_rank_test.h"
#include "test/trace_reader.h"

namespace gradsync {
namespace testing {

// Four small tensors (fused) and one large enough to be reduced alone.
inline const std::vector<int64_t> kSizes = {8, 33, 64, 1000, 70000};

inline AllreduceOptions Named(const std::string& name, const ProcessSet& set = ProcessSet()) {
  AllreduceOptions options;
  options.name = name;
  options.process_set = set;
  return options;
}

inline bool DeviceTensors() {
  const char* value = std::getenv("GRADSYNC_TEST_DEVICE_TENSORS");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// Device allreduce launches, in launch order: the launching thread and the bucket's tensors.
struct NotedLaunch {
  std::thread::id thread;
  size_t tensors = 0;
};
inline std::mutex launches_mu;
inline std::vector<NotedLaunch> launches;

// The device plane over the host backend, noting each allreduce launch.
class LaunchNotingPlane : public DevicePlane {
 public:
  using DevicePlane::DevicePlane;
  Status Allreduce(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) override {
    {
      std::lock_guard<std::mutex> lock(launches_mu);
      launches.push_back({std::this_thread::get_id(), entries.size()});
    }
    return DevicePlane::Allreduce(entries, spec);
  }
};

inline Status MakeLaunchNotingPlane(const Config& config, MPI_Comm comm, const Device&,
                                    std::unique_ptr<DataPlane>* plane) {
  std::unique_ptr<HostDeviceBackend> backend;
  GRADSYNC_RETURN_IF_ERROR(HostDeviceBackend::Create(comm, &backend));
  *plane = std::make_unique<LaunchNotingPlane>(std::move(backend), comm,
                                               DeviceCompletionTimeout(config));
  return Status::OK();
}

// Producer readiness recorded on a host stream whose address stands in for a cudaStream_t; the
// records are counted. The per-thread default stream's handle gets each recording thread a stream
// of its own, as CUDA does, and the threads that record on it are noted.
inline std::atomic<int> readiness_records{0};
inline std::mutex per_thread_mu;
inline std::vector<std::thread::id> per_thread_recorders;

inline Status RecordOnHostStream(void* stream, int, std::shared_ptr<StreamEvent>* ready) {
  readiness_records.fetch_add(1);
  if (stream == PerThreadStreamHandle()) {
    thread_local HostStream own;
    {
      std::lock_guard<std::mutex> lock(per_thread_mu);
      per_thread_recorders.push_back(std::this_thread::get_id());
    }
    *ready = own.Record();
    return Status::OK();
  }
  *ready = static_cast<HostStream*>(stream)->Record();
  return Status::OK();
}

class LockedScheduleTest : public MultiRankTest {
 protected:
  void SetUp() override {
    if (DeviceTensors()) {
      SetDevicePlaneFactoryForTesting(&MakeLaunchNotingPlane);
      SetReadinessRecorderForTesting(&RecordOnHostStream);
    }
    {
      std::lock_guard<std::mutex> lock(launches_mu);
      launches.clear();
    }
    MultiRankTest::SetUp();
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(test.begin(), test.end(), '/', '_');  // a parameterized test's name has one
    trace_path_ = fs::temp_directory_path() /
                  ("gradsync_locked_" + std::to_string(getpid()) + "_" + test + ".json");
    start_timeline(trace_path_.string());
  }
  void TearDown() override {
    if (!trace_stopped_) stop_timeline();
    if (rank_ == 0) fs::remove(trace_path_);
    MultiRankTest::TearDown();
    SetDevicePlaneFactoryForTesting(nullptr);
    SetReadinessRecorderForTesting(nullptr);
  }

  // What the operations are given: the tensor, labelled cuda:0 in the device variant.
  static TensorView View(HostTensor& tensor) {
    TensorView view = tensor.view();
    if (DeviceTensors()) view.device = Device::Cuda(0);
    return view;
  }

  // GRADSYNC_CALLER_LAUNCH as this run sets it.
  static CallerLaunch CallerLaunchMode() {
    Config config;
    EXPECT_TRUE(Config::FromEnvironment(&config).ok());
    return config.caller_launch;
  }

  static bool LockingOn() {
    const char* value = std::getenv("GRADSYNC_LOCKED_SCHEDULE");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }

  // The lock wait the library reads from this run's GRADSYNC_LOCK_WAIT_MS.
  static std::chrono::milliseconds LockWait() {
    Config config;
    EXPECT_TRUE(Config::FromEnvironment(&config).ok());
    return std::chrono::milliseconds(static_cast<int64_t>(config.lock_wait_ms));
  }

  std::string Name(size_t i) const { return "lock.g" + std::to_string(i); }

  std::unique_ptr<HostTensor> Filled(int64_t n, int64_t offset, int rank) {
    auto t = std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{n});
    for (int64_t i = 0; i < n; ++i) t->Set(i, Value(ReduceOp::kSum, rank, i + offset));
    return t;
  }

  // One training step: every tensor enqueued (before any is waited on), then all waited on and
  // checked. The sums hold the values of ranks from `first_contributor` on (the ones before it
  // have joined and add zeros). `grouped`: the tensors in one grouped allreduce, under the same
  // names.
  void RunStep(int step, int first_contributor = 0, bool grouped = false) {
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<Handle> handles;
    GroupedAllreduceOptions group;
    std::vector<TensorView> views;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      tensors.push_back(Filled(kSizes[t], step + static_cast<int64_t>(t), rank_));
      if (grouped) {
        views.push_back(View(*tensors.back()));
        group.names.push_back(Name(t));
      } else {
        handles.push_back(allreduce(View(*tensors.back()), Named(Name(t))));
      }
    }
    if (grouped) handles = grouped_allreduce(views, group);
    for (size_t t = 0; t < kSizes.size(); ++t) {
      ASSERT_TRUE(Succeeds(handles[t])) << "step " << step << " " << Name(t);
      ExpectSums(*tensors[t], step + static_cast<int64_t>(t), first_contributor, size_);
    }
  }

  // Sums of Value over ranks [first, end).
  void ExpectSums(const HostTensor& tensor, int64_t offset, int first, int end) {
    for (int64_t i = 0; i < tensor.size(); ++i) {
      double expected = 0;
      for (int r = first; r < end; ++r) expected += Value(ReduceOp::kSum, r, i + offset);
      ASSERT_EQ(tensor.Get(i), expected) << "element " << i;
    }
  }

  // Rank 0's marks whose name starts with `prefix`; stops the timeline first.
  std::vector<std::string> Marks(const std::string& prefix) {
    if (!trace_stopped_) {
      stop_timeline();
      trace_stopped_ = true;
      // No rank shuts down (which leaves the lock, an UNLOCK on rank 0) before rank 0's timeline
      // has stopped.
      MPI_Barrier(MPI_COMM_WORLD);
    }
    std::vector<std::string> marks;
    if (rank_ != 0) return marks;
    const Trace trace = LoadTrace(trace_path_);
    for (const Json& e : trace.events) {
      const std::string name = StringField(e, "name");
      if (StringField(e, "ph") == "i" && name.rfind(prefix, 0) == 0) marks.push_back(name);
    }
    return marks;
  }

  static std::string Joined(const std::vector<std::string>& marks) {
    std::string all;
    for (const std::string& mark : marks) all += mark + "; ";
    return all;
  }

  size_t LockedWaits() {
    if (rank_ != 0) return 0;
    return LoadTrace(trace_path_).Count("B", "LOCKED_ALLREDUCE");
  }

  fs::path trace_path_;
  bool trace_stopped_ = false;
};

}  // namespace testing
}  // namespace gradsync
