// A framework's CUDA handles as the device plane's events, for the public API: a producer's
// readiness in, and stream-ordered completion out. Free of CUDA includes (handles are void*).
//
// Thread safety: any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "gradsync/status.h"
#include "runtime/stream.h"

namespace gradsync {

// The producer's readiness for an input on cuda:`device`: `cuda_event` (a cudaEvent_t the caller
// recorded after the work that writes the input, and does not record again until the operation
// is launched), or else an event gradsync records now on `cuda_stream` (a cudaStream_t). Sets
// *ready to null when both are null. Unsupported in a build without CUDA.
Status ImportReadiness(void* cuda_event, void* cuda_stream, int device,
                       std::shared_ptr<StreamEvent>* ready);

// CUDA's handle for the calling thread's own default stream (cudaStreamPerThread): on another
// thread the same handle names that thread's stream, so only the enqueuing thread may record on it.
inline void* PerThreadStreamHandle() { return reinterpret_cast<void*>(uintptr_t{0x2}); }

// Orders the work given to `cuda_stream` from now on after `done`: on the device, without
// blocking, when `done` is a CUDA event; otherwise (a host event: the MPI backend's) by waiting
// on the host until it completes. Returns the failure of an operation that failed.
Status OrderStreamAfter(const std::shared_ptr<StreamEvent>& done, void* cuda_stream);

// For gradsync's own threads (the finalizer), which look at a GPU's events without launching on
// it: makes the device of `event` (a CUDA event) current on the calling thread unless it is. A
// thread with no device selected would otherwise do its CUDA calls as device 0's, setting up a
// context there on every rank of a node whose GPU is another. Never for a caller's thread, whose
// device is the caller's. Does nothing for other events, or in a build without CUDA.
Status UseDeviceOfEvent(const StreamEvent& event);

// Keeps the calling thread's current CUDA device across a scope in which gradsync's device
// backends select their own: a caller's thread that launches a bucket (the background loop's
// cycle run on it) is left on the device it had. Does nothing in a build without CUDA.
class CallerDeviceScope {
 public:
  CallerDeviceScope();
  ~CallerDeviceScope();
  CallerDeviceScope(const CallerDeviceScope&) = delete;
  CallerDeviceScope& operator=(const CallerDeviceScope&) = delete;
  // The device current at construction; -1 when it could not be read (or without CUDA).
  int device() const { return device_; }

 private:
  int device_ = -1;  // -1: none to restore
};

}  // namespace gradsync
