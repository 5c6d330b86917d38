#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "ops/cuda/cuda_status.h"
#include "ops/cuda/cuda_stream.h"
#include "ops/device/device_events.h"

namespace gradsync {
namespace {

// An event recorded on a producer's stream: its source and the order of its record among all such
// events, so that a bucket waits only for the latest event of each producer stream.
class ReadinessEvent : public CudaEvent {
 public:
  ReadinessEvent(cudaEvent_t event, int device, const void* stream, uint64_t sequence)
      : CudaEvent(event, device, std::make_shared<CudaStreamFailure>(), /*owned=*/false),
        stream_(stream),
        sequence_(sequence) {}
  ~ReadinessEvent() override { GivePooledEvent(device(), native()); }
  const void* source() const override { return stream_; }
  uint64_t sequence() const override { return sequence_; }

 private:
  const void* stream_;
  uint64_t sequence_;
};

// The legacy default stream and the thread's own (cudaStreamPerThread) are the current device's,
// so work for cuda:`device` given to one of them is given with that device current; *restore then
// brings the caller's device back. A stream the caller made belongs to its device whatever is
// current, and the thread's device is left alone (switching back to device 0 on a thread without
// a context would make one there).
Status SelectDeviceForStream(cudaStream_t stream, int device,
                             std::optional<CallerDeviceScope>* restore) {
  if (stream != cudaStreamLegacy && stream != cudaStreamPerThread) return Status::OK();
  restore->emplace();
  if ((*restore)->device() == device) return Status::OK();
  return CudaResult(cudaSetDevice(device), "cudaSetDevice", device);
}

// Orders the records of readiness events: the sequence of a record is taken under the same lock,
// so two threads recording on one stream cannot get sequences in the other order.
std::mutex record_mu;
uint64_t records = 0;

}  // namespace

Status ImportReadiness(void* cuda_event, void* cuda_stream, int device,
                       std::shared_ptr<StreamEvent>* ready) {
  *ready = nullptr;
  if (cuda_event != nullptr) {
    // The caller's event: waited on, never destroyed here.
    *ready = std::make_shared<CudaEvent>(cuda_event, device, std::make_shared<CudaStreamFailure>(),
                                         /*owned=*/false);
    return Status::OK();
  }
  if (cuda_stream == nullptr) return Status::OK();
  void* pooled = nullptr;
  GRADSYNC_RETURN_IF_ERROR(TakePooledEvent(device, &pooled));
  const auto event = static_cast<cudaEvent_t>(pooled);
  // A locked cycle records a caller's readiness on whichever thread runs it, whose current device
  // may be another GPU's.
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  std::optional<CallerDeviceScope> restore;
  const Status selected = SelectDeviceForStream(stream, device, &restore);
  if (!selected.ok()) {
    GivePooledEvent(device, event);
    return selected;
  }
  uint64_t sequence = 0;
  Status recorded;
  {
    std::lock_guard<std::mutex> lock(record_mu);
    sequence = ++records;
    recorded = CudaResult(cudaEventRecord(event, stream), "cudaEventRecord", device);
  }
  if (!recorded.ok()) {
    GivePooledEvent(device, event);
    return recorded;
  }
  // Every thread's own stream has the same handle: its events are waited for each by itself
  // (no source), never taken for the latest of one stream.
  const void* source = stream == cudaStreamPerThread ? nullptr : cuda_stream;
  *ready = std::make_shared<ReadinessEvent>(event, device, source, sequence);
  return Status::OK();
}

Status OrderStreamAfter(const std::shared_ptr<StreamEvent>& done, void* cuda_stream) {
  if (done == nullptr) return Status::OK();
  auto* cuda_event = dynamic_cast<CudaEvent*>(done.get());
  if (cuda_event == nullptr || cuda_stream == nullptr) {
    return done->Wait(kWaitForever);
  }
  // A default stream here is the one of the device the result is on, whatever the caller's thread
  // has current (a trainer that placed its model on cuda:1 without selecting that device); the
  // query below is made with that device current too.
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  std::optional<CallerDeviceScope> restore;
  GRADSYNC_RETURN_IF_ERROR(SelectDeviceForStream(stream, cuda_event->device(), &restore));
  // An event that already failed (an aborted plane) is reported instead of waited for.
  if (cuda_event->Query()) {
    GRADSYNC_RETURN_IF_ERROR(done->Wait(std::chrono::nanoseconds(0)));
  }
  return CudaResult(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(cuda_event->native()), 0),
                    "cudaStreamWaitEvent", cuda_event->device());
}

Status UseDeviceOfEvent(const StreamEvent& event) {
  const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
  if (cuda_event == nullptr) return Status::OK();
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == cuda_event->device()) {
    return Status::OK();
  }
  return CudaResult(cudaSetDevice(cuda_event->device()), "cudaSetDevice", cuda_event->device());
}

// A thread with no CUDA context yet reports device 0 without error, and restoring 0 there makes
// device 0's primary context current (creating it if the process has none); so the readiness
// record above uses a scope only for the default streams, on threads that already run work there.
CallerDeviceScope::CallerDeviceScope() {
  int device = -1;
  if (cudaGetDevice(&device) == cudaSuccess) device_ = device;
}

CallerDeviceScope::~CallerDeviceScope() {
  int now = -1;
  if (device_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != device_) cudaSetDevice(device_);
}

}  // namespace gradsync
