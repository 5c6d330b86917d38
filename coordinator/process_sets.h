// Process sets as the background thread runs them.
//
// ProcessSetRuntime: one set this rank belongs to: its communicators (the global set uses
// MpiContext's own), its negotiator (with the set's response cache, readiness table and stall
// inspector), its locked schedule, its host data plane (with the set's fusion buffer), and the
// entries drained for it that it has not negotiated yet.
//
// ProcessSets: every set this rank belongs to, by id, and the adding and removing of sets. Adding
// and removing are collective over every rank and change every rank's view identically (ids are
// handed out in call order), so the per-set cycles stay in step.
//
// Both are created by init() on its thread before the background thread starts, then used by the
// background thread only; the registry they update is the caller threads' view.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/autotuner.h"
#include "coordinator/control_channel.h"
#include "coordinator/fusion_planner.h"
#include "coordinator/locked_schedule.h"
#include "coordinator/negotiator.h"
#include "ops/data_plane.h"
#include "ops/mpi/mpi_data_plane.h"
#include "runtime/config.h"
#include "runtime/mpi_context.h"
#include "runtime/process_set_registry.h"
#include "runtime/timeline.h"

namespace gradsync {

class ProcessSetRuntime {
 public:
  // `owned` (null for the global set) holds `control` and `data` and is freed last. `spin_first`
  // as for MpiControlChannel.
  ProcessSetRuntime(int32_t id, std::vector<int> ranks, MPI_Comm control, MPI_Comm data,
                    std::unique_ptr<SubsetCommunicators> owned, const Config& config,
                    Timeline* timeline, bool spin_first);

  int32_t id() const { return id_; }
  const std::vector<int>& ranks() const { return ranks_; }
  Negotiator& negotiator() { return *negotiator_; }
  // How the set's negotiation waits for late peers (ControlChannel::SetPatient).
  void SetPatient(bool patient) { channel_->SetPatient(patient); }
  // The set's locked schedule, which takes the negotiator's place while locked.
  LockedSchedule& lock() { return *lock_; }
  MPI_Comm data_comm() const { return data_comm_; }
  // The piece size of the set's MPI allreduces of host memory (MpiDataPlane::piece_bytes).
  int64_t allreduce_piece_bytes() const;
  // Whether the set's last host allreduce went through node shared memory.
  bool last_allreduce_shared() const;
  // The plane for tensors on `device`. A device's plane is created by its first operation (the
  // same one on every member), which fails when this build or machine cannot serve the device;
  // the failure is kept and returned for every later operation there.
  Status PlaneFor(const Device& device, DataPlane** plane);
  // This rank's device of `negotiated`'s kind, for a joined rank's stand-in, which has no tensor
  // to say: the device of the set's plane of that kind; before any, the GPU chosen for this rank
  // (config.gpu_device), else `negotiated` (rank 0's).
  Device OwnDevice(const Device& negotiated) const;
  // The joined ranks' stand-ins every device plane holds are not needed any more.
  void ReleaseStandIns();
  // How this set's buckets are planned: the configured settings, with the in-place cutoff taken
  // from the measured costs once calibrated (unless GRADSYNC_INPLACE_THRESHOLD pins it).
  const FusionSettings& fusion() const { return fusion_; }
  bool calibrated() const { return calibrated_; }
  // Collective over the set's members, at the same point of the same cycle on each: measures the
  // host plane's costs (or, with GRADSYNC_CALIBRATE=0, does nothing) and fits the cost model.
  // A failure is logged and leaves the configured settings.
  void Calibrate();
  // GRADSYNC_AUTOTUNE: called with every cycle's responses once they ran, the same on every
  // member. Ends a tuning window when the step marker has run Autotuner::kStepsPerWindow more
  // times (one small allreduce of the window's time, collective over the members in that same
  // cycle), and applies the next settings.
  void ObserveForAutotune(const std::vector<const Response*>& responses);
  // The cycle time the set's tuner plans with; the configured one without a tuner.
  double cycle_time_ms() const;
  // Whether the set's tuner is still trying settings: a schedule locked meanwhile would keep the
  // buckets of the candidate it locked under, whatever the tuner went on to measure and choose.
  bool tuning() const;
  // Entries drained for this set since its last cycle.
  std::vector<TensorEntry*>& fresh() { return fresh_; }

 private:
  int32_t id_;
  std::vector<int> ranks_;
  std::unique_ptr<SubsetCommunicators> owned_comms_;
  std::unique_ptr<ControlChannel> channel_;
  std::unique_ptr<Negotiator> negotiator_;
  std::unique_ptr<LockedSchedule> lock_;
  std::unique_ptr<MpiDataPlane> host_plane_;
  FusionSettings fusion_;
  bool calibrated_ = false;
  struct Tuning {
    std::unique_ptr<Autotuner> tuner;
    std::string marker;  // the allreduce whose runs mark the steps
    int steps = 0;       // marker runs in this window
    int64_t runs = 0;    // allreduces run in this window
    int remarks = 0;     // markers given up on, as not repeating
    std::chrono::steady_clock::time_point window_start;
    std::ofstream log;  // rank 0's trajectory
  };
  std::unique_ptr<Tuning> tuning_;
  // Calibrate's parts. First the members agree on GRADSYNC_ALLREDUCE_PIECE_BYTES (one small
  // allreduce): the piece size fixes the sequence of collectives, and a rank that pinned it must
  // not skip the probe that the others run; where any rank set it, every rank takes the smallest
  // value set. Then fitting the costs (and settings) to measurements, then with GRADSYNC_AUTOTUNE,
  // the tuner, starting from those settings.
  void AgreeOnPieces();
  void MeasureCosts();
  // MeasureCosts' first part: the piece size of the set's MPI allreduces, as pinned or from the
  // probe, with the words for the policy line; false (logged) when the probe failed.
  bool SettlePieces(std::string* policy);
  void StartAutotune();
  // Whether GRADSYNC_HIERARCHICAL_ALLREDUCE is left to calibration.
  static bool HierarchyByCalibration(const Config& config);
  MPI_Comm data_comm_;
  Config config_;
  struct DevicePlaneSlot {
    Device device;
    std::unique_ptr<DataPlane> plane;  // null when creating it failed
    Status failure;
  };
  std::vector<DevicePlaneSlot> device_planes_;
  std::vector<TensorEntry*> fresh_;
};

class ProcessSets {
 public:
  // Registers and runs the global set (id 0) over `mpi`'s communicators. All pointers must outlive
  // this object.
  ProcessSets(const MpiContext& mpi, const Config& config, Timeline* timeline,
              ProcessSetRegistry* registry);

  // Collective over every rank, with the same ascending `ranks` everywhere (check that first):
  // creates the next set, registers it and, on members, runs it. Fails identically on every rank
  // when a set with these ranks exists.
  Status Add(const std::vector<int>& ranks, int32_t* id);
  // Collective over every rank: forgets set `id` and frees its communicators. The entries it still
  // held are appended to *orphaned for the caller to fail. Fails identically on every rank for the
  // global set or an unknown id.
  Status Remove(int32_t id, std::vector<TensorEntry*>* orphaned);
  // A set whose negotiation failed (a stall, or a broken control plane) stops running here and
  // takes no more operations; its entries are appended to *orphaned. It stays registered, closed
  // with `reason`, until removed.
  void Close(int32_t id, const Status& reason, std::vector<TensorEntry*>* orphaned);

  // The set with the smallest id greater than `after` that this rank runs, or null: iteration
  // that stays valid while a cycle adds or removes sets.
  ProcessSetRuntime* Next(int32_t after);
  ProcessSetRuntime* Find(int32_t id);
  ProcessSetRuntime& global() { return *sets_.at(0); }
  // Whether the global set is the only one this rank runs.
  bool RunsOnlyGlobal() const { return sets_.size() == 1; }
  // Why an entry for set `id`, which this rank does not run, cannot run.
  Status Unavailable(int32_t id) const;

 private:
  // Whether control exchanges poll without yielding before they sleep (see MpiControlChannel).
  bool SpinFirst() const;

  const MpiContext& mpi_;
  Config config_;
  Timeline* timeline_;
  ProcessSetRegistry* registry_;
  std::map<int32_t, std::unique_ptr<ProcessSetRuntime>> sets_;
  // Ids are never reused: one below this that the registry no longer holds was removed.
  int32_t next_id_ = 1;
};

// Fails unless every rank of `comm` passed the same `values`; the Mismatch says what each rank
// passed and is the same on every rank. Collective over `comm`. `what` names the call.
Status CheckSameOnEveryRank(MPI_Comm comm, const std::vector<int64_t>& values,
                            const std::string& what);

}  // namespace gradsync
