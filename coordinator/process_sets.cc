#include "coordinator/process_sets.h"

#include <algorithm>
#include <utility>

#include "coordinator/cost_model.h"
#include "coordinator/mpi_control_channel.h"
#include "coordinator/node_lock_channel.h"
#include "ops/device/device_plane_factory.h"
#include "ops/mpi/mpi_data_plane.h"
#include "runtime/logging.h"

namespace gradsync {

namespace {

void TakeEntries(ProcessSetRuntime* set, std::vector<TensorEntry*>* orphaned) {
  for (TensorEntry* entry : set->negotiator().TakeAllPending()) orphaned->push_back(entry);
  for (TensorEntry* entry : set->lock().TakeAllHeld()) orphaned->push_back(entry);
  orphaned->insert(orphaned->end(), set->fresh().begin(), set->fresh().end());
  set->fresh().clear();
}

// "[0, 2, 3]"
std::string ValuesString(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

// Pinned by GRADSYNC_HIERARCHICAL_ALLREDUCE, or left to calibration, which needs the path ready to
// compare (flat until it has).
bool HierarchicalRequested(const Config& config) {
  return config.hierarchical_allreduce_pinned ? config.hierarchical_allreduce : config.calibrate;
}

}  // namespace

bool ProcessSetRuntime::HierarchyByCalibration(const Config& config) {
  return !config.hierarchical_allreduce_pinned && config.calibrate;
}

ProcessSetRuntime::ProcessSetRuntime(int32_t id, std::vector<int> ranks, MPI_Comm control,
                                     MPI_Comm data, std::unique_ptr<SubsetCommunicators> owned,
                                     const Config& config, Timeline* timeline, bool spin_first)
    : id_(id),
      ranks_(std::move(ranks)),
      owned_comms_(std::move(owned)),
      channel_(std::make_unique<MpiControlChannel>(
          control, spin_first,
          LongWait{config.stall_warning_seconds,
                   "process set " + std::to_string(id) + "'s negotiation",
                   config.PeerThreadGiveUpSeconds()})),
      // The global set's ranks are their own labels; a subset's messages name global ranks.
      negotiator_(std::make_unique<Negotiator>(channel_.get(), config, nullptr, timeline,
                                               id_ == 0 ? std::vector<int>() : ranks_, id_)),
      lock_(std::make_unique<LockedSchedule>(std::make_unique<NodeLockChannel>(control),
                                             LockSettings::From(config), id_)),
      host_plane_(std::make_unique<MpiDataPlane>(data, timeline, config.shm_threshold_bytes,
                                                 HierarchicalRequested(config))),
      fusion_(FusionSettings::From(config)),
      data_comm_(data),
      config_(config) {
  if (HierarchyByCalibration(config)) host_plane_->LeaveHierarchyToCalibration(kNeverInPlace);
  host_plane_->set_pipeline_chunk_bytes(config.pipeline_chunk_bytes);
  host_plane_->set_piece_bytes(config.allreduce_piece_bytes);
}

Device ProcessSetRuntime::OwnDevice(const Device& negotiated) const {
  for (const DevicePlaneSlot& slot : device_planes_) {
    if (slot.device.kind == negotiated.kind) return slot.device;
  }
  // Before any: the GPU init chose for this rank (gpu_device()), where its tensors will come
  // from. Rank 0's would make a plane that takes the ranks for sharing a GPU, and this rank's
  // first tensor on its own GPU would then ask for a second plane alone, which is collective.
  if (negotiated.kind == DeviceKind::kCuda && config_.gpu_device >= 0) {
    return Device::Cuda(config_.gpu_device);
  }
  return negotiated;
}

Status ProcessSetRuntime::PlaneFor(const Device& device, DataPlane** plane) {
  if (device.kind == DeviceKind::kCpu) {
    *plane = host_plane_.get();
    return Status::OK();
  }
  for (DevicePlaneSlot& slot : device_planes_) {
    if (slot.device != device) continue;
    *plane = slot.plane.get();
    return slot.failure;
  }
  for (const DevicePlaneSlot& slot : device_planes_) {
    // Only a joined rank's stand-ins, on a GPU other than the one its tensors came from later,
    // get here (the enqueue refuses a second GPU): making a plane is collective, and the other
    // ranks would never take part.
    if (slot.device.kind == device.kind) {
      return Status::InvalidArgument(
          "process set " + std::to_string(id_) + ": an operation on " + DeviceName(device) +
          ", but this rank's plane is on " + DeviceName(slot.device) +
          " (where its stand-ins went while it had joined: gpu_device(), GRADSYNC_GPU_DEVICE); "
          "one GPU a process is supported");
    }
  }
  DevicePlaneSlot slot{device, nullptr, Status::OK()};
  const DevicePlaneFactory make =
      DevicePlaneFactoryForTesting() != nullptr ? DevicePlaneFactoryForTesting() : MakeDevicePlane;
  slot.failure = make(config_, data_comm_, device, &slot.plane);
  if (slot.failure.ok()) {
    Log().info("process set {}: device plane for {} ready", id_, DeviceName(device));
  } else {
    Log().error("process set {}: no device plane for {}: {}", id_, DeviceName(device),
                slot.failure.ToString());
  }
  *plane = slot.plane.get();
  device_planes_.push_back(std::move(slot));
  return device_planes_.back().failure;
}

void ProcessSetRuntime::ReleaseStandIns() {
  for (DevicePlaneSlot& slot : device_planes_) {
    if (slot.plane != nullptr) slot.plane->ReleaseStandIns();
  }
}

ProcessSets::ProcessSets(const MpiContext& mpi, const Config& config, Timeline* timeline,
                         ProcessSetRegistry* registry)
    : mpi_(mpi), config_(config), timeline_(timeline), registry_(registry) {
  ProcessSetInfo info;
  info.id = 0;
  for (int r = 0; r < mpi.size(); ++r) info.ranks.push_back(r);
  info.set_rank = mpi.rank();
  sets_[0] = std::make_unique<ProcessSetRuntime>(0, info.ranks, mpi.control_comm(), mpi.data_comm(),
                                                 nullptr, config_, timeline_, SpinFirst());
  registry_->Add(std::move(info));
}

bool ProcessSets::SpinFirst() const { return mpi_.cores_per_rank() >= 2; }

Status ProcessSets::Add(const std::vector<int>& ranks, int32_t* id) {
  // The registry is the same on every rank here, so every rank refuses alike.
  const int32_t existing = registry_->FindByRanks(ranks);
  if (existing >= 0) {
    return Status::InvalidArgument("process set " + std::to_string(existing) +
                                   " already has exactly ranks " + RankListString(ranks));
  }
  std::unique_ptr<SubsetCommunicators> comms;
  GRADSYNC_RETURN_IF_ERROR(SubsetCommunicators::Split(mpi_, ranks, &comms));
  ProcessSetInfo info;
  info.id = next_id_++;
  info.ranks = ranks;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == mpi_.rank()) info.set_rank = static_cast<int>(i);
  }
  if (info.set_rank >= 0) {
    const MPI_Comm control = comms->control();
    const MPI_Comm data = comms->data();
    sets_[info.id] = std::make_unique<ProcessSetRuntime>(
        info.id, ranks, control, data, std::move(comms), config_, timeline_, SpinFirst());
  }
  *id = info.id;
  Log().debug("process set {} added: ranks {}", info.id, RankListString(ranks));
  registry_->Add(std::move(info));
  return Status::OK();
}

Status ProcessSets::Remove(int32_t id, std::vector<TensorEntry*>* orphaned) {
  if (id == 0) return Status::InvalidArgument("the global process set (id 0) cannot be removed");
  ProcessSetInfo info;
  if (!registry_->Find(id, &info)) {
    return Status::InvalidArgument("process set " + std::to_string(id) +
                                   " does not exist (never added, or removed already)");
  }
  auto it = sets_.find(id);
  if (it != sets_.end()) {
    TakeEntries(it->second.get(), orphaned);
    sets_.erase(it);  // frees the set's communicators on every member at the same point
  }
  registry_->Remove(id);
  Log().debug("process set {} removed", id);
  return Status::OK();
}

void ProcessSets::Close(int32_t id, const Status& reason, std::vector<TensorEntry*>* orphaned) {
  auto it = sets_.find(id);
  if (it == sets_.end()) return;
  TakeEntries(it->second.get(), orphaned);
  sets_.erase(it);
  registry_->Close(id, reason);
}

ProcessSetRuntime* ProcessSets::Next(int32_t after) {
  auto it = sets_.upper_bound(after);
  return it == sets_.end() ? nullptr : it->second.get();
}

ProcessSetRuntime* ProcessSets::Find(int32_t id) {
  // Nearly every entry is in the global set, the map's first: no search for it.
  if (!sets_.empty() && sets_.begin()->first == id) return sets_.begin()->second.get();
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second.get();
}

Status ProcessSets::Unavailable(int32_t id) const {
  ProcessSetInfo info;
  if (id > 0 && id < next_id_ && !registry_->Find(id, &info)) {
    return Status::Shutdown("process set " + std::to_string(id) +
                            " was removed while this operation was pending");
  }
  int set_rank = 0;
  int set_size = 0;
  const Status membership = registry_->Membership(id, &set_rank, &set_size);
  if (!membership.ok()) return membership;
  return Status::Internal("process set " + std::to_string(id) + " is not running on this rank");
}

Status CheckSameOnEveryRank(MPI_Comm comm, const std::vector<int64_t>& values,
                            const std::string& what) {
  int size = 0;
  GRADSYNC_MPI_CALL(MPI_Comm_size(comm, &size));
  const int count = static_cast<int>(values.size());
  std::vector<int> counts(size);
  GRADSYNC_MPI_CALL(MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm));
  std::vector<int> displacements(size, 0);
  for (int r = 1; r < size; ++r) displacements[r] = displacements[r - 1] + counts[r - 1];
  std::vector<int64_t> all(static_cast<size_t>(displacements.back() + counts.back()));
  GRADSYNC_MPI_CALL(MPI_Allgatherv(values.data(), count, MPI_INT64_T, all.data(), counts.data(),
                                   displacements.data(), MPI_INT64_T, comm));
  std::vector<std::pair<std::vector<int64_t>, std::vector<int>>> groups;  // value -> ranks
  for (int r = 0; r < size; ++r) {
    std::vector<int64_t> v(all.begin() + displacements[r],
                           all.begin() + displacements[r] + counts[r]);
    auto it = groups.begin();
    while (it != groups.end() && it->first != v) ++it;
    if (it == groups.end()) {
      groups.push_back({std::move(v), {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (groups.size() == 1) return Status::OK();
  std::string message = what + ": ranks disagree: ";
  for (size_t g = 0; g < groups.size(); ++g) {
    message += (g ? "; " : "") + std::string(groups[g].second.size() == 1 ? "rank " : "ranks ") +
               RankListString(groups[g].second) + " passed " + ValuesString(groups[g].first);
  }
  return Status::Mismatch(message);
}

}  // namespace gradsync
