#include "ops/device/producer_readiness.h"

#include <atomic>

#include "ops/device/device_events.h"

namespace gradsync {
namespace {

std::atomic<ReadinessRecorder> recorder_for_testing{nullptr};

Status Record(void* stream, int device, std::shared_ptr<StreamEvent>* ready) {
  const ReadinessRecorder recorder = recorder_for_testing.load(std::memory_order_acquire);
  if (recorder != nullptr) return recorder(stream, device, ready);
  return ImportReadiness(/*cuda_event=*/nullptr, stream, device, ready);
}

struct Recorded {
  void* stream;
  int device;
  std::shared_ptr<StreamEvent> event;  // null: the record failed
};

}  // namespace

Status RecordProducerReadiness(TensorEntry* const* entries, size_t count) {
  Status first_failure;
  // Entries come from a handful of streams at most: a scan beats a map.
  std::vector<Recorded> recorded;
  for (size_t i = 0; i < count; ++i) {
    TensorEntry* entry = entries[i];
    if (entry->ready_stream == nullptr) continue;
    const int device = entry->input.device.index;
    Recorded* match = nullptr;
    for (Recorded& r : recorded) {
      if (r.stream == entry->ready_stream && r.device == device) match = &r;
    }
    if (match == nullptr) {
      recorded.push_back({entry->ready_stream, device, nullptr});
      match = &recorded.back();
      const Status status = Record(match->stream, device, &match->event);
      if (!status.ok()) {
        match->event = nullptr;
        if (first_failure.ok()) first_failure = status;
      }
    }
    if (match->event == nullptr) continue;
    entry->ready = match->event;
    entry->ready_stream = nullptr;
  }
  return first_failure;
}

bool RecordAtEnqueue(void* ready_stream, bool deferrable) {
  return !deferrable || ready_stream == PerThreadStreamHandle();
}

void SetReadinessRecorderForTesting(ReadinessRecorder recorder) {
  recorder_for_testing.store(recorder, std::memory_order_release);
}

}  // namespace gradsync
