// BackgroundLoop: the one background thread of a gradsync process. Each cycle it drains the tensor
// queue, negotiates with the other ranks, plans fusion, runs the buckets on the data plane and
// completes the handles. An idle process sleeps up to the cycle time between cycles (one small
// control allreduce per cycle) and wakes early when work arrives.
//
// Owns the negotiator and the data planes; uses the entries it drains until it releases them to the
// queue, which owns them. Start and Shutdown are called by init()/shutdown() on one caller thread;
// everything else runs on the loop's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "coordinator/control_channel.h"
#include "coordinator/fusion_planner.h"
#include "coordinator/negotiator.h"
#include "ops/data_plane.h"
#include "runtime/config.h"
#include "runtime/mpi_context.h"
#include "runtime/tensor_queue.h"
#include "runtime/timeline.h"

namespace gradsync {

class BackgroundLoop {
 public:
  // `timeline` (not null; active on rank 0 only, when started) must outlive the loop.
  BackgroundLoop(const Config& config, const MpiContext& mpi, TensorQueue* queue,
                 Timeline* timeline);
  ~BackgroundLoop();

  void Start();
  // Asks every rank to stop (pending operations fail with a Shutdown error) and joins the thread.
  void Shutdown();

 private:
  void Run();
  // How long to wait for new work before the next cycle.
  std::chrono::nanoseconds NextWait() const;
  // One cycle; false once the loop must end.
  bool RunOneCycle();
  // Drains the queue; the entries are held until completed.
  std::vector<TensorEntry*> TakeFreshEntries();
  // Timeline marks for a cycle's outcome: negotiation ends for every response.
  void MarkNegotiated(const CycleOutcome& outcome);
  // Runs the cycle's responses in order; a non-OK result is fatal (stall shutdown).
  Status Execute(const CycleOutcome& outcome);
  // Runs one bucket: `response` is its first response, `members` this rank's entries for all.
  Status ExecuteBucket(const ResponsePtr& response, const std::vector<TensorEntry*>& members);
  DataPlane* PlaneFor(const Device& device);
  // Releases the names and entries, then completes their handles.
  void Complete(const std::vector<TensorEntry*>& members, const Status& status);
  // Closes the queue with `reason` and fails every operation this process still holds.
  void FailEverything(const Status& reason);

  Config config_;
  FusionSettings fusion_;
  int rank_;
  TensorQueue* queue_;
  std::unique_ptr<ControlChannel> channel_;
  Timeline* timeline_;
  std::unique_ptr<Negotiator> negotiator_;
  std::unique_ptr<DataPlane> host_plane_;
  std::vector<std::shared_ptr<OpState>> completing_;  // Complete's scratch
  size_t held_ = 0;              // entries drained from the queue and not yet completed
  int unproductive_cycles_ = 0;  // consecutive cycles that executed nothing
  std::atomic<bool> shutdown_requested_{false};
  std::thread thread_;
};

}  // namespace gradsync
