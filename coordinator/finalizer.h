// Finalizer: the thread that completes device operations. The background thread launches a bucket
// on a device plane and hands the bucket's entries here with the plane's completion event; the
// finalizer watches every such event and completes the bucket when its event does (a plane's
// buckets in the order they were added), so that the background thread goes straight on to its
// next cycle instead of waiting for the device.
//
// It is also where device work is kept from hanging: while a plane has work in flight the
// finalizer polls the plane's asynchronous errors, and aborts the plane when one is reported or
// when a bucket has not finished within the plane's completion timeout. Aborting fails the events
// of everything in flight on that plane, so those buckets complete too, with the abort's status,
// which names the bucket that timed out and its tensors (an entry that had failed on this rank
// alone keeps its own status).
//
// A CUDA event's query takes the driver's lock that the trainer's kernel launches take too, so
// an event that says so (StreamEvent::QueryContends) is looked at less often the longer its
// bucket has been in flight (QueryPacer). A completion is then seen at most about 6% of its
// latency late (or a millisecond), and a bucket that waits a millisecond behind the backward
// costs at most about 100 queries, where looking at every turn of the loop would make hundreds in
// its first 100 us alone. An event that tells of its completion (StreamEvent::NotifyOnCompletion:
// a host stream's, which the MPI backend for ranks sharing a GPU completes on its thread) wakes
// the finalizer when it completes, so that the finalizer sleeps through a long bucket instead of
// looking at it after ever longer pauses, which saw a completion up to half its latency late.
// Between buckets the finalizer looks for the next one between yields for a while before it
// sleeps (SpinWindow: longer when its buckets have been arriving further apart), so that the
// caller launching a step's next bucket seldom pays the system call that wakes it.
//
// Thread safety: Add, AddLocalFailures and Drain are called by whichever thread runs the
// background loop's cycle (its own thread, or a caller launching a locked bucket), one at a time,
// and by shutdown on the thread that joined it; the completion function runs on the finalizer's
// own thread, which is started by the first bucket handed over, so a process that never touches
// a device has no such thread. Add only appends to an inbox under a mutex; the finalizer moves the
// inbox to buckets of its own and queries their events without that mutex, so a launching thread
// never waits behind a query of the device, and the finalizer's polling between operations takes
// no lock at all.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradsync/status.h"
#include "ops/data_plane.h"
#include "runtime/query_pacer.h"
#include "runtime/spin_window.h"
#include "runtime/stream.h"
#include "runtime/tensor_entry.h"
#include "runtime/timeline.h"

namespace gradsync {

class Finalizer {
 public:
  // Completes a bucket's entries with its status. Runs on the finalizer's thread.
  using CompleteFn = std::function<void(const std::vector<TensorEntry*>&, const Status&)>;

  // `timeline`, when not null, gets each bucket's device phases (DataPlane::TakePhases) as it
  // completes.
  explicit Finalizer(CompleteFn complete, Timeline* timeline = nullptr);
  // With its own bounds on looking between buckets (tests: one whose yields never count as the
  // core wanted, so that a loaded machine does not change what they see).
  Finalizer(CompleteFn complete, Timeline* timeline, const SpinWindow& spin);
  // Drains, then stops the thread.
  ~Finalizer();
  Finalizer(const Finalizer&) = delete;
  Finalizer& operator=(const Finalizer&) = delete;

  // Takes a launched bucket: `entries` (stand-ins included; the function skips what it must) are
  // completed once `done` completes. `plane` must outlive the bucket; `process_set` is for
  // messages.
  // `phases`, recorded while the timeline was on, are drawn on the entries' rows from
  // `launched` (when the launch was queued) on.
  void Add(DataPlane* plane, int32_t process_set, const std::vector<TensorEntry*>& entries,
           std::shared_ptr<StreamEvent> done, std::vector<DataPlane::TimedPhase> phases = {},
           std::chrono::steady_clock::time_point launched = {});
  // Takes entries that failed on this rank alone while the collective they are part of still runs
  // (DataPlane's LocalFailure): each completes with its own status once `done` has completed, and
  // not before, because until then the device may still read its input.
  void AddLocalFailures(DataPlane* plane, int32_t process_set,
                        const std::vector<LocalFailure>& failures,
                        const std::shared_ptr<StreamEvent>& done);
  // Blocks until every bucket handed over so far has completed. Each does, by its event, an
  // error, or its timeout, so this ends.
  void Drain();
  // Buckets handed over and not completed yet.
  size_t pending() const;
  // How many times the finalizer was found asleep and woken (by Add, an event, or shutdown): each
  // cost the waking thread a system call.
  size_t sleeping_wakeups() const;
  // GRADSYNC_STALL_WARNING_SECONDS: a bucket still on the device this long after it was added is
  // logged, naming its tensors, and again every period after; zero: never. Negotiation is over for
  // such a bucket, so no stall inspector sees it, and its timeout may be long or off. Set before
  // the first bucket is added.
  void set_slow_warning(std::chrono::nanoseconds every) { slow_warning_ = every; }
  // How many such warnings were logged.
  size_t slow_warnings() const { return slow_warnings_.load(std::memory_order_relaxed); }

 private:
  struct Bucket {
    DataPlane* plane = nullptr;
    int32_t process_set = 0;
    std::vector<TensorEntry*> entries;
    std::shared_ptr<StreamEvent> done;
    std::chrono::steady_clock::time_point deadline;
    std::vector<DataPlane::TimedPhase> phases;
    std::chrono::steady_clock::time_point launched;
    std::chrono::steady_clock::time_point added;         // handed to Add
    std::chrono::steady_clock::time_point next_warning;  // see set_slow_warning
    // Used when the event's query contends (StreamEvent::QueryContends).
    QueryPacer pacer{std::chrono::steady_clock::time_point()};
    // The event tells the finalizer when it completes (StreamEvent::NotifyOnCompletion).
    bool notifies = false;
    // Not OK for a local failure: the entries complete with it, whatever the event says.
    Status failed_here;
  };
  class Wakeup;

  // A bucket whose deadline is the plane's completion timeout from now.
  static Bucket NewBucket(DataPlane* plane, int32_t process_set,
                          const std::vector<TensorEntry*>& entries,
                          std::shared_ptr<StreamEvent> done);
  // Hands a bucket to the finalizer's thread, which it starts the first time.
  void Push(Bucket bucket);
  void Run();
  void WarnOfSlowBucket(const Bucket& bucket, std::chrono::steady_clock::time_point now);
  // Moves what Add handed over into owned_, asking each event to tell of its completion. Returns
  // whether there was any.
  bool Adopt();
  // Draws a completed bucket's phases on the timeline: each from the end of the one before (the
  // first from the launch) to its event's completion; stops at a phase whose time is unknown.
  void TracePhases(const Bucket& bucket);
  // One look at every owned bucket: completes the finished ones, aborts the planes of late ones
  // and of those reporting errors. Returns the number completed. Skips the query of a contending
  // event that is not due yet, and sets next_contended_query_, next_deadline_ and polled_.
  size_t Sweep();
  // "allreduce of tensors 'a', 'b' and 3 more on process set 0": the bucket, for messages.
  static std::string Describe(const Bucket& bucket);

  CompleteFn complete_;
  Timeline* timeline_;
  mutable std::mutex mu_;
  std::condition_variable drained_;  // a bucket completed
  std::vector<Bucket> inbox_;        // under mu_: handed over, not yet adopted
  size_t adopted_ = 0;  // under mu_: adopted and not yet completed (owned_, and those completing)
  std::atomic<bool> inbox_filled_{false};  // inbox_ is not empty; read without mu_
  std::atomic<bool> stopping_{false};
  // Where the finalizer sleeps; woken by Add, by the destructor, and by the events it was given
  // that tell of their completion.
  const std::shared_ptr<Wakeup> wakeup_;
  // The finalizer thread's alone.
  std::deque<Bucket> owned_;
  bool device_warned_ = false;  // UseDeviceOfEvent failed once
  std::chrono::steady_clock::time_point last_error_poll_;
  // When a bucket last arrived or completed: the finalizer polls without sleeping for a while
  // after, as long as spin_ says from how far apart the buckets have been arriving.
  std::chrono::steady_clock::time_point active_at_;
  SpinWindow spin_;
  // The earliest a contending event is due to be looked at again; max() when none is owned.
  std::chrono::steady_clock::time_point next_contended_query_ =
      std::chrono::steady_clock::time_point::max();
  // The earliest deadline of an owned bucket; max() when none is owned.
  std::chrono::nanoseconds slow_warning_{0};
  std::atomic<size_t> slow_warnings_{0};
  std::chrono::steady_clock::time_point next_deadline_ =
      std::chrono::steady_clock::time_point::max();
  // An owned bucket's event neither tells of its completion nor contends: it is looked at after
  // pauses that double while nothing completes.
  bool polled_ = false;
  std::thread thread_;
};

}  // namespace gradsync
