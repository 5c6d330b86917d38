// BackgroundLoop: the one background thread of a gradsync process. Each cycle it drains the tensor
// queue and hands each entry to its process set; then, for every set this rank belongs to, in id
// order (the same on every rank), it negotiates with the set's other ranks, plans fusion, runs the
// buckets on the set's data plane and completes the handles. An idle process sleeps up to the
// cycle time between cycles (one small control allreduce per set per cycle) and wakes early when
// work arrives.
//
// Buckets that a device plane launched are completed later by the finalizer's thread; everything
// else completes on the loop's thread before the next bucket runs.
//
// Owns the process sets (their negotiators and data planes); uses the entries it drains until it
// releases them to the queue, which owns them. The constructor, AddProcessSet, Start and Shutdown
// are called by init()/shutdown() on one caller thread; a cycle runs on the loop's thread, or,
// while the schedule is locked, on a caller's thread in RunCycleForCaller, one cycle at a time
// under cycle_mu_, which guards the sets, their planes and the cycle's own state; Complete is
// called by the finalizer too.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/finalizer.h"
#include "coordinator/fusion_planner.h"
#include "coordinator/lane_keeper.h"
#include "coordinator/negotiator.h"
#include "coordinator/process_sets.h"
#include "ops/data_plane.h"
#include "runtime/config.h"
#include "runtime/mpi_context.h"
#include "runtime/process_set_registry.h"
#include "runtime/tensor_queue.h"
#include "runtime/timeline.h"

namespace gradsync {

class BackgroundLoop {
 public:
  // `timeline` (active on rank 0 only, when started), `mpi`, `queue`, `registry` and `lanes` must
  // outlive the loop.
  BackgroundLoop(const Config& config, const MpiContext& mpi, TensorQueue* queue,
                 Timeline* timeline, ProcessSetRegistry* registry, CallerLaneTable* lanes);
  ~BackgroundLoop();

  // Before Start, collective over every rank: a process set declared at init.
  Status AddProcessSet(const std::vector<int>& ranks, int32_t* id);
  // Starts the thread, named "gradsync-loop"; it calls `on_thread_start` (placement binds it
  // there) before its first cycle.
  void Start(std::function<void()> on_thread_start = {});
  // Asks every rank to stop (pending operations fail with a Shutdown error) and joins the thread.
  void Shutdown();
  // Returns once the loop has run a whole cycle that began after the call (any thread; at once
  // when the loop has stopped): what this rank pushed before the call has been negotiated in a
  // round, and every request the others sent in rounds this rank had joined before the call has
  // reached the coordinator. Used to keep join()'s order of arrival with caller lanes.
  void WaitForFreshCycle();

  // Whether a caller that pushes a device tensor should ask for RunCycleForCaller (cheap, any
  // thread): the loop's sets are all locked, and GRADSYNC_CALLER_LAUNCH gives the caller the next
  // bucket (every bucket, or one of a single tensor).
  bool RunsCallerCycles() const { return caller_cycles_.load(std::memory_order_relaxed); }
  // Whether a caller that pushes a device tensor may leave its producer's readiness to the launch
  // of its bucket (cheap, any thread): the loop's sets are all locked, so that the bucket is
  // launched once it is full, on the caller's thread or on the loop's (see
  // ops/device/producer_readiness.h).
  bool DefersReadiness() const { return all_locked_.load(std::memory_order_relaxed); }
  // Called by a caller whose push the queue reported due (TensorQueue::Push): runs the loop's
  // cycle on the calling thread, so that a locked bucket the push filled is launched at once
  // instead of after a hand-off to the background thread. Wakes the background thread instead
  // when it is in a cycle of its own, and after the cycle when it has work left (an exchange in
  // flight, a set that left the lock).
  void RunCycleForCaller();

 private:
  void Run();
  // How long to wait for new work before the next cycle.
  std::chrono::nanoseconds NextWait() const;
  // GRADSYNC_CYCLE_TIME_MS, which also bounds how long a cycle waits for a burst of enqueues to
  // end.
  std::chrono::nanoseconds CycleTime() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
  }
  // How much of the next wait for work to spend looking between yields before sleeping: the rest
  // of a window after each device launch. A caller waiting on small device operations submits its
  // next within microseconds of the last one's completion, and a sleeping thread takes tens of
  // microseconds to wake.
  std::chrono::nanoseconds PollWindow() const {
    const auto left =
        device_launched_at_ + std::chrono::microseconds(200) - std::chrono::steady_clock::now();
    return std::max(std::chrono::nanoseconds(0), left);
  }
  // Waits for work, then runs a cycle; false once the loop must end.
  bool RunOneCycle();
  // One cycle over every process set, under cycle_mu_; false once the loop must end. On a
  // caller's thread (`on_caller`) only locked sets run, and a set that leaves the lock leaves what
  // it held for the loop's thread to negotiate. Sets *pause_until when the loop's thread should
  // let a streaming caller's burst gather before its next cycle.
  bool RunCycle(bool on_caller, std::chrono::steady_clock::time_point* pause_until);
  // Takes cycle_mu_ for the loop's thread. A caller's cycle holds it for microseconds: the loop's
  // thread looks between yields first, so that the caller's unlock need not wake it.
  std::unique_lock<std::mutex> LockCycle();
  // Whether every set this rank runs is locked (the caller may run cycles).
  bool AllSetsLocked();
  // One set's share of a cycle; false once the loop must end (only the global set ends it: a
  // failing process set is closed and the rest go on). Sets *productive if anything ran.
  bool RunSetCycle(ProcessSetRuntime* set, bool on_caller, bool* productive);
  // RunSetCycle for a set whose schedule is locked: its locked schedule takes the fresh entries
  // and gives the buckets every member has reached, which run here. If the set leaves the lock,
  // what it held goes back into its fresh entries.
  bool RunLockedCycle(ProcessSetRuntime* set, bool on_caller, bool* productive);
  static std::vector<TensorEntry*> EntriesOf(const std::vector<CycleOutcome>& buckets, size_t from);
  // A set failed with `why`: the global set fails everything (returns false: the loop ends); any
  // other set is closed, failing `taken` with what it held (returns true).
  bool FailSet(ProcessSetRuntime* set, const Status& why, const std::vector<TensorEntry*>& taken);
  // The locked set's schedule, or null while no set is locked (only one set locks at a time).
  const LockedSchedule* LockedSet();
  // Drains the queue; the entries are held until completed.
  std::vector<TensorEntry*> TakeFreshEntries();
  // Hands each entry to its set's next cycle, failing those whose set this rank does not run.
  void Distribute(const std::vector<TensorEntry*>& entries);
  // Timeline marks for a cycle's outcome: negotiation ends for every response.
  void MarkNegotiated(const CycleOutcome& outcome);
  // Runs the cycle's responses in order; a non-OK result is fatal to the set (a stall shutdown).
  Status Execute(ProcessSetRuntime* set, const CycleOutcome& outcome);
  // Runs one bucket: `response` is its first response, `members` this rank's entries for all.
  // Entries that failed on this rank alone are left in local_failures_. *plane is the data plane
  // it ran on (null for those that need none). `record_phases`: a device plane records the
  // bucket's phases for the timeline.
  Status ExecuteBucket(ProcessSetRuntime* set, const Response& response,
                       const std::vector<TensorEntry*>& members, bool record_phases,
                       DataPlane** plane);
  Status ExecuteAddProcessSet(TensorEntry* entry);
  Status ExecuteRemoveProcessSet(TensorEntry* entry);
  // On a joined rank: an allreduce input of the response's shape holding the identity of its
  // reduce op, so the rank takes part without changing the result. Valid until the next Execute;
  // a device response's stand-in is moved to its device plane, which keeps it until the join.
  // A failure is fatal to the set: this rank could not take part.
  Status StandIn(ProcessSetRuntime* set, const Response& response, TensorEntry** stand_in);
  // Releases the names and entries, then completes their handles. Stand-ins are skipped. Called
  // by the loop's thread and the finalizer's, one at a time.
  void Complete(const std::vector<TensorEntry*>& members, const Status& status);
  // Completes each of the bucket's local failures with its own status and takes it out of
  // members_, so that the bucket's status goes to the others only.
  void CompleteLocalFailures();
  // A device bucket's launch, `launched` its completion event: members_ and local_failures_ go to
  // the finalizer, which completes each once the event has. A launch that `executed` reports as
  // failed failed on this rank alone (DataPlane::TakeCompletion): its entries are local failures.
  void HandToFinalizer(int32_t set_id, DataPlane* plane, const Status& executed,
                       std::shared_ptr<StreamEvent> launched, bool traced);
  // Stops running process set `id` and fails with `reason` what it held and the entries in
  // `taken` (those of its last outcome that did not complete).
  void CloseSet(int32_t id, const Status& reason, const std::vector<TensorEntry*>& taken);
  // Closes the queue with `reason` and fails every operation this process still holds.
  void FailEverything(const Status& reason);

  struct StandInEntry {
    TensorEntry entry;
    std::vector<unsigned char> buffer;
  };

  Config config_;
  const MpiContext& mpi_;
  TensorQueue* queue_;
  Timeline* timeline_;
  ProcessSets sets_;
  LaneKeeper lanes_;
  std::mutex completion_mu_;                  // one Complete at a time
  std::vector<TensorEntry*> releasing_;       // Complete's scratch, under completion_mu_
  std::vector<TensorEntry*> members_;         // Execute's scratch
  std::vector<TensorEntry*> unrecorded_;      // Distribute's scratch
  std::vector<LocalFailure> local_failures_;  // ExecuteBucket's, for the bucket being run
  std::vector<std::unique_ptr<StandInEntry>> stand_ins_;
  size_t stand_ins_used_ = 0;
  // Entries drained from the queue and not yet completed.
  std::atomic<size_t> held_{0};
  int unproductive_cycles_ = 0;  // consecutive cycles that executed nothing
  // When the loop's thread last found nothing held (max while something is).
  std::chrono::steady_clock::time_point idle_since_ = std::chrono::steady_clock::time_point::max();
  bool lock_exchanging_ = false;  // a locked set ended the cycle with an exchange in flight
  // At the end of the last cycle: 0 while no set is locked, else the entries the locked set's
  // next bucket still needs, at least 1.
  size_t wake_after_ = 0;
  std::chrono::steady_clock::time_point device_launched_at_;  // the last device bucket's launch
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<uint64_t> cycles_run_{0};  // by the loop's thread: WaitForFreshCycle
  std::atomic<bool> running_{false};
  std::mutex cycle_mu_;                     // one cycle at a time, on whichever thread
  std::atomic<bool> all_locked_{false};     // DefersReadiness()
  std::atomic<bool> caller_cycles_{false};  // RunsCallerCycles()
  bool stop_ = false;                       // a caller's cycle ended the loop; under cycle_mu_
  std::thread thread_;
  // Last: destroyed first, completing what it still holds while the rest is intact.
  Finalizer finalizer_;
};

}  // namespace gradsync
