// runtime/stream.h over CUDA: a non-blocking, highest-priority stream of one device, and events
// recorded on it. Free of CUDA includes (native handles travel as void*), so host-only code can
// include it.
//
// Abort cannot take back work already launched on a device. It marks the stream failed: every
// event of the stream not yet seen complete then reports the abort's status (one seen complete
// before stays so, as the host stream's do), and later records fail at once. Whoever
// aborts must also release what the stuck work waits for (an NCCL communicator is aborted with
// ncclCommAbort) before the stream's resources are freed.
//
// Thread safety: as runtime/stream.h. Every CUDA call's result is checked where it is made; a
// failure becomes a CudaError status naming the call, the device and CUDA's message.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#include "runtime/stream.h"

namespace gradsync {

// Events for reuse: untimed ones (cudaEventDisableTiming) for readiness and for every bucket's
// completion, timed ones for the timeline's device phases (CudaStream::RecordTimed).
// cudaEventCreate and cudaEventDestroy take the driver's locks, which the trainer's own launches
// wait for, and a launch that made its phases' events would time its own making of them. An event
// given back may still be pending; recording it again is safe, as a stream that waits for it
// captured its earlier record. Any thread.
Status TakePooledEvent(int device, void** event, bool timed = false);
void GivePooledEvent(int device, void* event, bool timed = false);

// The abort state one stream shares with its events.
struct CudaStreamFailure {
  std::mutex mu;
  bool failed = false;
  Status status;
};

// A timed event of a stream, finished, and the steady-clock moment its completion was seen: a
// timed event's completion is that moment plus cudaEventElapsedTime from this one.
struct CudaClockAnchor {
  ~CudaClockAnchor();
  void* event = nullptr;  // a cudaEvent_t, owned
  std::chrono::steady_clock::time_point at;
};

class CudaEvent : public StreamEvent {
 public:
  // `owned`: destroyed with this object (false for a caller's event). `anchor`: for a timed event
  // (CudaStream::RecordTimed), what CompletedAt measures from.
  CudaEvent(void* event, int device, std::shared_ptr<CudaStreamFailure> failure, bool owned = true,
            std::shared_ptr<const CudaClockAnchor> anchor = nullptr);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool Query() override;
  bool QueryContends() const override { return true; }
  // Polls the event, sleeping between looks, so the waiting thread does not spin a core.
  Status Wait(std::chrono::nanoseconds timeout) override;
  bool CompletedAt(std::chrono::steady_clock::time_point* at) override;

  void* native() const { return event_; }  // a cudaEvent_t
  int device() const { return device_; }

 private:
  // Sets *settled once the event has completed or failed, and returns the failure, if any. An
  // abort's status may itself be a Timeout, so "not yet" is never told by the status.
  Status Poll(bool* settled);

  void* event_;
  int device_;
  std::shared_ptr<CudaStreamFailure> failure_;
  bool owned_;
  std::shared_ptr<const CudaClockAnchor> anchor_;
  std::atomic<bool> seen_complete_{false};  // before any abort: its work is done and sound
};

class CudaStream : public Stream {
 public:
  // A stream on `device` (cudaStreamNonBlocking, the device's highest priority).
  static Status Create(int device, std::unique_ptr<CudaStream>* stream);
  ~CudaStream() override;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  std::shared_ptr<StreamEvent> Record() override;
  // A timing-enabled event. The first one (and the first after 30 s, so that the float elapsed
  // times keep microseconds) also records an anchor on a stream of its own, with no work, and waits
  // on the host for it: microseconds, paid only by a caller that records the timeline.
  std::shared_ptr<StreamEvent> RecordTimed() override;
  // `event` must be a CudaEvent; any other kind fails the stream with InvalidArgument.
  void WaitFor(std::shared_ptr<StreamEvent> event) override;
  void Abort(const Status& status) override;

  void* native() const { return stream_; }  // a cudaStream_t
  int device() const { return device_; }

 private:
  CudaStream(void* stream, void* anchor_stream, int device);
  // A new event recorded on the stream (timing-enabled when `timed`), or a failed one.
  std::shared_ptr<StreamEvent> RecordEvent(bool timed,
                                           std::shared_ptr<const CudaClockAnchor> anchor);
  // The anchor for a timed event recorded now, renewed when missing or old.
  Status FreshAnchor(std::shared_ptr<const CudaClockAnchor>* anchor);

  void* stream_;
  void* anchor_stream_;  // a cudaStream_t that never has work (see FreshAnchor)
  int device_;
  std::shared_ptr<CudaStreamFailure> failure_ = std::make_shared<CudaStreamFailure>();
  std::mutex anchor_mu_;
  std::shared_ptr<const CudaClockAnchor> anchor_;
};

}  // namespace gradsync
