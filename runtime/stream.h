// The narrow interface the device data plane is written against: streams that run their work in
// order, and events that mark a point in a stream. The CUDA implementation wraps cudaStream_t and
// cudaEvent_t; the host implementation (host_stream.h) runs each stream on a thread of its own,
// so that the plane's ordering, completion, timeout and abort logic is tested without a GPU.
//
// Thread safety: a Stream may be used from several threads; work enqueued by one thread runs in
// that thread's order. Events may be queried and waited on from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

// A wait without a deadline, for Wait and the like: long enough never to end, short enough that
// adding it to a clock's now() does not overflow (nanoseconds::max() would).
constexpr std::chrono::nanoseconds kWaitForever = std::chrono::hours(24 * 365 * 10);

// Told by an event that it has completed (StreamEvent::NotifyOnCompletion), on the thread that
// completed it: EventCompleted must be quick and must not block.
class CompletionListener {
 public:
  virtual ~CompletionListener() = default;
  virtual void EventCompleted() = 0;
};

class StreamEvent {
 public:
  virtual ~StreamEvent() = default;

  // True once everything the recording stream had been given before the event was recorded has
  // run, or once that stream was aborted. Never blocks.
  virtual bool Query() = 0;

  // Blocks until Query() is true, for at most `timeout`: OK when the work ran, Timeout when it
  // has not yet, and the abort's status when the stream was aborted first.
  virtual Status Wait(std::chrono::nanoseconds timeout) = 0;

  // When the work before the event finished, on the steady clock, for the timeline: true with *at
  // set once the event has completed successfully and its stream can tell (every event of a host
  // stream; a device stream's from RecordTimed). Never blocks.
  virtual bool CompletedAt(std::chrono::steady_clock::time_point* at) {
    (void)at;
    return false;
  }

  // True when Query() enters a driver that the threads launching work also enter, under a lock of
  // the driver's (a CUDA event's query takes its context's): a thread that polls such an event
  // spaces its looks out, so that polling does not slow the trainer's launches. A host event's
  // query is a load, looked at as often as wanted.
  virtual bool QueryContends() const { return false; }

  // Asks the event to tell `listener` once it completes, so that a thread that waits for many
  // events can sleep until one completes instead of looking at each again and again. False when
  // the event cannot tell (a device's, whose completion only a query shows): it must be polled.
  // True for an event that has completed already, which then tells nothing. The event holds one
  // listener, shared so that it can tell it after Query() shows the completion, outside the
  // event's own lock, whatever the listener's owner does meanwhile.
  virtual bool NotifyOnCompletion(const std::shared_ptr<CompletionListener>& listener) {
    (void)listener;
    return false;
  }

  // Where the event was recorded, for a stream that must wait for many events at once (a bucket's
  // producers): the events of one source complete in the order of their `sequence`, so waiting
  // for the latest is waiting for all. Null when unknown: the event is waited for itself.
  virtual const void* source() const { return nullptr; }
  virtual uint64_t sequence() const { return 0; }
};

// The events a stream must wait for to have waited for all of `events`: the latest of each known
// source, and every event of unknown source, in their first order. Null events are skipped.
std::vector<StreamEvent*> LatestPerSource(const std::vector<StreamEvent*>& events);

class Stream {
 public:
  virtual ~Stream() = default;

  // An event that completes once everything given to this stream so far has run.
  virtual std::shared_ptr<StreamEvent> Record() = 0;

  // As Record(), with an event that can tell when it completed (CompletedAt). It may cost more
  // than Record(), so it is for the timeline, while it records.
  virtual std::shared_ptr<StreamEvent> RecordTimed() { return Record(); }

  // Work given to this stream after this call starts only once `event` has completed. Returns at
  // once: the stream waits, not the caller.
  virtual void WaitFor(std::shared_ptr<StreamEvent> event) = 0;

  // Fails the stream: work not yet started is dropped, later work is never run, and every event
  // of this stream, recorded or to be recorded, completes with `status`. For an operation that
  // does not finish in time; the stream cannot be used again.
  virtual void Abort(const Status& status) = 0;
};

}  // namespace gradsync
