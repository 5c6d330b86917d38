#include "ops/cuda/cuda_stream.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "runtime/query_pacer.h"

namespace gradsync {
namespace {

Status CudaFailure(const char* call, int device, cudaError_t error) {
  return Status(StatusCode::kCudaError, std::string(call) + " on cuda:" + std::to_string(device) +
                                            " failed: " + cudaGetErrorName(error) + " (" +
                                            cudaGetErrorString(error) + ")");
}

// An event that failed before it was recorded: it reports `status` and owns no CUDA event.
class FailedEvent : public StreamEvent {
 public:
  explicit FailedEvent(Status status) : status_(std::move(status)) {}
  bool Query() override { return true; }
  Status Wait(std::chrono::nanoseconds) override { return status_; }

 private:
  Status status_;
};

Status FailureOf(CudaStreamFailure* failure) {
  std::lock_guard<std::mutex> lock(failure->mu);
  return failure->failed ? failure->status : Status::OK();
}

void Fail(CudaStreamFailure* failure, const Status& status) {
  std::lock_guard<std::mutex> lock(failure->mu);
  if (failure->failed) return;
  failure->failed = true;
  failure->status = status;
}

class EventPool {
 public:
  bool Take(int device, cudaEvent_t* event) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
      if (it->first != device) continue;
      *event = it->second;
      free_.erase(std::next(it).base());
      return true;
    }
    return false;
  }
  bool Give(int device, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() >= kKept) return false;
    free_.emplace_back(device, event);
    return true;
  }

 private:
  static constexpr size_t kKept = 4096;  // a step's gradients, several times over
  std::mutex mu_;
  std::vector<std::pair<int, cudaEvent_t>> free_;
};

EventPool& Pool(bool timed) {
  static auto* untimed_pool = new EventPool;  // outlive every event
  static auto* timed_pool = new EventPool;
  return timed ? *timed_pool : *untimed_pool;
}

// A stream's event, back to its pool when its last holder lets go.
class PooledEvent : public CudaEvent {
 public:
  PooledEvent(cudaEvent_t event, int device, std::shared_ptr<CudaStreamFailure> failure, bool timed,
              std::shared_ptr<const CudaClockAnchor> anchor)
      : CudaEvent(event, device, std::move(failure), /*owned=*/false, std::move(anchor)),
        timed_(timed) {}
  ~PooledEvent() override { GivePooledEvent(device(), native(), timed_); }

 private:
  bool timed_;
};

// An event belongs to the device current at its creation, and the calling thread may be on
// another (the background thread recording a caller's readiness for a second GPU, a caller
// launching a bucket with its own device current): made on `device`, the thread's own restored.
Status CreateEventOn(int device, bool timed, cudaEvent_t* event) {
  int current = -1;
  cudaError_t error = cudaGetDevice(&current);
  if (error != cudaSuccess) return CudaFailure("cudaGetDevice", device, error);
  if (current != device && (error = cudaSetDevice(device)) != cudaSuccess) {
    return CudaFailure("cudaSetDevice", device, error);
  }
  error = cudaEventCreateWithFlags(event, timed ? cudaEventDefault : cudaEventDisableTiming);
  const cudaError_t restored = current != device ? cudaSetDevice(current) : cudaSuccess;
  if (error != cudaSuccess) return CudaFailure("cudaEventCreateWithFlags", device, error);
  if (restored != cudaSuccess) {
    cudaEventDestroy(*event);
    *event = nullptr;
    return CudaFailure("cudaSetDevice", current, restored);
  }
  return Status::OK();
}

}  // namespace

Status TakePooledEvent(int device, void** event, bool timed) {
  cudaEvent_t taken = nullptr;
  if (!Pool(timed).Take(device, &taken))
    GRADSYNC_RETURN_IF_ERROR(CreateEventOn(device, timed, &taken));
  *event = taken;
  return Status::OK();
}

void GivePooledEvent(int device, void* event, bool timed) {
  if (!Pool(timed).Give(device, static_cast<cudaEvent_t>(event))) {
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
}

CudaClockAnchor::~CudaClockAnchor() {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

CudaEvent::CudaEvent(void* event, int device, std::shared_ptr<CudaStreamFailure> failure,
                     bool owned, std::shared_ptr<const CudaClockAnchor> anchor)
    : event_(event),
      device_(device),
      failure_(std::move(failure)),
      owned_(owned),
      anchor_(std::move(anchor)) {}

bool CudaEvent::CompletedAt(std::chrono::steady_clock::time_point* at) {
  if (anchor_ == nullptr) return false;
  bool settled = false;
  if (!Poll(&settled).ok() || !settled) return false;
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(anchor_->event),
                           static_cast<cudaEvent_t>(event_)) != cudaSuccess) {
    return false;  // not a timed pair after all: the timeline leaves this phase out
  }
  *at = anchor_->at + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double, std::milli>(ms));
  return true;
}

CudaEvent::~CudaEvent() {
  if (owned_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

Status CudaEvent::Poll(bool* settled) {
  *settled = true;
  if (seen_complete_.load(std::memory_order_acquire)) return Status::OK();
  GRADSYNC_RETURN_IF_ERROR(FailureOf(failure_.get()));
  const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (state == cudaSuccess) {
    seen_complete_.store(true, std::memory_order_release);
    return Status::OK();
  }
  if (state == cudaErrorNotReady) {
    *settled = false;
    return Status::OK();
  }
  return CudaFailure("cudaEventQuery", device_, state);
}

bool CudaEvent::Query() {
  bool settled = false;
  Poll(&settled);
  return settled;
}

Status CudaEvent::Wait(std::chrono::nanoseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  // Spaced as the finalizer spaces its looks, since each query takes the driver's lock that the
  // trainer's launches take, yet seen within a sixteenth of the wait.
  QueryPacer pacer(start);
  for (;;) {
    bool settled = false;
    Status status = Poll(&settled);
    if (settled) return status;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status::Timeout("the stream's work before this event has not finished on cuda:" +
                             std::to_string(device_) + " after " +
                             std::to_string(std::chrono::duration<double>(timeout).count()) + " s");
    }
    pacer.Looked(now);
    PauseUntil(std::min(pacer.next(), deadline));
  }
}

Status CudaStream::Create(int device, std::unique_ptr<CudaStream>* stream) {
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) return CudaFailure("cudaSetDevice", device, error);
  int least = 0;
  int greatest = 0;  // numerically lowest: the highest priority
  error = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (error != cudaSuccess) return CudaFailure("cudaDeviceGetStreamPriorityRange", device, error);
  cudaStream_t raw = nullptr;
  error = cudaStreamCreateWithPriority(&raw, cudaStreamNonBlocking, greatest);
  if (error != cudaSuccess) return CudaFailure("cudaStreamCreateWithPriority", device, error);
  // Where clock anchors are recorded: a stream with no work, so that waiting for an anchor never
  // waits for the collectives (or their producers) queued on the other.
  cudaStream_t idle = nullptr;
  error = cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking);
  if (error != cudaSuccess) {
    cudaStreamDestroy(raw);
    return CudaFailure("cudaStreamCreateWithFlags", device, error);
  }
  stream->reset(new CudaStream(raw, idle, device));
  return Status::OK();
}

CudaStream::CudaStream(void* stream, void* anchor_stream, int device)
    : stream_(stream), anchor_stream_(anchor_stream), device_(device) {}

CudaStream::~CudaStream() {
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  cudaStreamDestroy(static_cast<cudaStream_t>(anchor_stream_));
}

std::shared_ptr<StreamEvent> CudaStream::Record() { return RecordEvent(false, nullptr); }

std::shared_ptr<StreamEvent> CudaStream::RecordTimed() {
  std::shared_ptr<const CudaClockAnchor> anchor;
  const Status anchored = FreshAnchor(&anchor);
  if (!anchored.ok()) return std::make_shared<FailedEvent>(anchored);
  return RecordEvent(true, std::move(anchor));
}

std::shared_ptr<StreamEvent> CudaStream::RecordEvent(
    bool timed, std::shared_ptr<const CudaClockAnchor> anchor) {
  Status failed = FailureOf(failure_.get());
  if (!failed.ok()) return std::make_shared<FailedEvent>(failed);
  void* pooled = nullptr;
  const Status taken = TakePooledEvent(device_, &pooled, timed);
  if (!taken.ok()) return std::make_shared<FailedEvent>(taken);
  const auto event = static_cast<cudaEvent_t>(pooled);
  std::shared_ptr<CudaEvent> recorded =
      std::make_shared<PooledEvent>(event, device_, failure_, timed, std::move(anchor));
  const cudaError_t error = cudaEventRecord(event, static_cast<cudaStream_t>(stream_));
  if (error != cudaSuccess) {
    return std::make_shared<FailedEvent>(CudaFailure("cudaEventRecord", device_, error));
  }
  return recorded;
}

Status CudaStream::FreshAnchor(std::shared_ptr<const CudaClockAnchor>* anchor) {
  std::lock_guard<std::mutex> lock(anchor_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (anchor_ != nullptr && now - anchor_->at < std::chrono::seconds(30)) {
    *anchor = anchor_;
    return Status::OK();
  }
  auto fresh = std::make_shared<CudaClockAnchor>();
  cudaEvent_t event = nullptr;
  GRADSYNC_RETURN_IF_ERROR(CreateEventOn(device_, /*timed=*/true, &event));
  fresh->event = event;
  // On the idle stream: the device's clock now, however much work the stream has queued (a
  // producer that never finishes would otherwise hold the launching thread here, past every
  // timeout). Elapsed times between events of one device hold across its streams.
  cudaError_t error = cudaEventRecord(event, static_cast<cudaStream_t>(anchor_stream_));
  if (error != cudaSuccess) return CudaFailure("cudaEventRecord", device_, error);
  error = cudaEventSynchronize(event);
  if (error != cudaSuccess) return CudaFailure("cudaEventSynchronize", device_, error);
  fresh->at = std::chrono::steady_clock::now();
  anchor_ = std::move(fresh);
  *anchor = anchor_;
  return Status::OK();
}

void CudaStream::WaitFor(std::shared_ptr<StreamEvent> event) {
  auto* cuda_event = dynamic_cast<CudaEvent*>(event.get());
  if (cuda_event == nullptr) {
    Fail(failure_.get(), Status::InvalidArgument("a CUDA stream can wait only for CUDA events"));
    return;
  }
  const cudaError_t error = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_),
                                                static_cast<cudaEvent_t>(cuda_event->native()), 0);
  if (error != cudaSuccess)
    Fail(failure_.get(), CudaFailure("cudaStreamWaitEvent", device_, error));
}

void CudaStream::Abort(const Status& status) { Fail(failure_.get(), status); }

}  // namespace gradsync
