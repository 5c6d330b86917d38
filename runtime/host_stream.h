// Streams and events in host memory: each HostStream runs its work items in order on a thread of
// its own, as a device runs a stream's kernels, so that code written against runtime/stream.h
// runs and is tested without a GPU.
//
// Thread safety: as runtime/stream.h. Destroying a HostStream waits for the work it has started
// and drops the rest; a wait for another stream's event is released by that event or by Abort().
// An event waited for that completes with a failure fails the stream with it, as a device's error
// fails the work queued behind it: what follows the wait reads what the failed work left.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/stream.h"

namespace gradsync {

class HostEvent : public StreamEvent {
 public:
  bool Query() override;
  Status Wait(std::chrono::nanoseconds timeout) override;

  // The moment Complete() was first called, when that was with OK.
  bool CompletedAt(std::chrono::steady_clock::time_point* at) override;

  // The stream's thread (or an abort) completes a host event: it tells its listener then.
  bool NotifyOnCompletion(const std::shared_ptr<CompletionListener>& listener) override;

  // Completes the event with `status` (the first completion wins).
  void Complete(const Status& status);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  std::chrono::steady_clock::time_point completed_at_;
  std::shared_ptr<CompletionListener> listener_;
};

class HostStream : public Stream {
 public:
  HostStream();
  ~HostStream() override;
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Runs `work` after everything given to this stream before it, on the stream's thread.
  void Enqueue(std::function<void()> work);

  std::shared_ptr<StreamEvent> Record() override;
  void WaitFor(std::shared_ptr<StreamEvent> event) override;
  void Abort(const Status& status) override;

  // Whether the stream's thread is inside an item (work, or a wait for an event): after an abort,
  // what the owner of the work's resources waits for before it frees them.
  bool running();

 private:
  struct Item {
    std::function<void()> work;             // run, unless the stream is aborted
    std::shared_ptr<StreamEvent> wait_for;  // or: wait for this event first
    std::shared_ptr<HostEvent> record;      // or: complete this event
  };

  void Push(Item item);
  void Run();
  // Waits for `event` in slices, so that an abort or the destructor is seen; a failed event aborts
  // the stream.
  void AwaitEvent(StreamEvent* event);
  // The same for an event whose query contends (a device's): its looks are paced (QueryPacer),
  // and an abort or the destructor ends a pause between them. Whether the event completed.
  bool AwaitContendingEvent(StreamEvent* event);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stopping_ = false;
  bool sleeping_ = false;  // the stream's thread waits on cv_ for work
  bool running_ = false;   // the stream's thread is inside an item
  bool aborted_ = false;
  Status abort_status_;
  std::thread thread_;
};

}  // namespace gradsync
