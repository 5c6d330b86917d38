// The readiness of device tensors given with their producer's stream: one event recorded per
// stream for a whole batch of entries, instead of one per tensor.
//
// A bucket's gradients mostly come from one stream, and the plane waits only for the latest event
// of each stream anyway (DevicePlane::WaitForInputs). So while a process set is locked, an enqueue
// records nothing: the launch of the entries' bucket records one event on each of their streams
// (DevicePlane::WaitForInputs), on whichever thread launches it, the caller's whose push filled
// the bucket (GRADSYNC_CALLER_LAUNCH) or the loop's, however many cycles took the bucket's
// entries. That event follows everything the producers queued before the bucket filled, and also
// whatever the caller queued on the stream since (on the loop's thread, the layers launched while
// the thread woke), which is waited for too, never skipped. Unlocked, negotiation takes entries
// later, when the producer's stream may be gone, so each enqueue (a group: once per stream)
// records its event at once; so does the cycle that takes an entry a locked enqueue left
// unrecorded into a set that is no longer locked.
//
// Thread safety: any thread, for entries that thread alone holds. The testing hook is set before
// init() and cleared after shutdown().
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "gradsync/status.h"
#include "runtime/stream.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

// Gives every entry of `entries` that holds a producer stream (TensorEntry::ready_stream) its
// `ready` event, recorded now, one per stream and device, and clears the stream. Returns the first
// failure; the entries whose stream could not be recorded on keep their ready_stream set.
Status RecordProducerReadiness(TensorEntry* const* entries, size_t count);
inline Status RecordProducerReadiness(const std::vector<TensorEntry*>& entries) {
  return RecordProducerReadiness(entries.data(), entries.size());
}

// Whether an entry given the producer stream `ready_stream` has its readiness recorded by its
// enqueue, on the enqueuing thread, or may leave it to the launch of its locked bucket
// (`deferrable`: the bucket is launched once full, by the push that fills it or by the background
// thread). The thread's own default stream (cudaStreamPerThread) is recorded at once: on the
// thread that launches, the same handle names another stream.
bool RecordAtEnqueue(void* ready_stream, bool deferrable);

// For tests without a GPU: while set, `recorder` records the events instead of CUDA (a host
// stream's Record(), say, with the stream handle pointing at it). Null restores CUDA.
using ReadinessRecorder = Status (*)(void* stream, int device, std::shared_ptr<StreamEvent>* ready);
void SetReadinessRecorderForTesting(ReadinessRecorder recorder);

}  // namespace gradsync
