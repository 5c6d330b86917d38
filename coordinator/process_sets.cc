#include "coordinator/process_sets.h"

#include <algorithm>
#include <utility>

#include "coordinator/cost_model.h"
#include "coordinator/mpi_control_channel.h"
#include "ops/device/device_plane_factory.h"
#include "ops/mpi/mpi_data_plane.h"
#include "runtime/logging.h"

namespace gradsync {

namespace {

void TakeEntries(ProcessSetRuntime* set, std::vector<TensorEntry*>* orphaned) {
  for (TensorEntry* entry : set->negotiator().TakeAllPending()) orphaned->push_back(entry);
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

bool HierarchyByCalibration(const Config& config) {
  return !config.hierarchical_allreduce_pinned && config.calibrate;
}

}  // namespace

ProcessSetRuntime::ProcessSetRuntime(int32_t id, std::vector<int> ranks, MPI_Comm control,
                                     MPI_Comm data, std::unique_ptr<SubsetCommunicators> owned,
                                     const Config& config, Timeline* timeline, bool spin_first)
    : id_(id),
      ranks_(std::move(ranks)),
      owned_comms_(std::move(owned)),
      channel_(std::make_unique<MpiControlChannel>(control, spin_first)),
      // The global set's ranks are their own labels; a subset's messages name global ranks.
      negotiator_(std::make_unique<Negotiator>(channel_.get(), config, nullptr, timeline,
                                               id_ == 0 ? std::vector<int>() : ranks_)),
      host_plane_(std::make_unique<MpiDataPlane>(data, timeline, config.shm_threshold_bytes,
                                                 HierarchicalRequested(config))),
      fusion_{config.fusion_threshold_bytes, config.inplace_threshold_bytes},
      data_comm_(data),
      config_(config) {
  if (HierarchyByCalibration(config)) host_plane_->LeaveHierarchyToCalibration(kNeverInPlace);
  host_plane_->set_pipeline_chunk_bytes(config.pipeline_chunk_bytes);
}

void ProcessSetRuntime::Calibrate() {
  calibrated_ = true;
  MeasureCosts();
  StartAutotune();
}

void ProcessSetRuntime::MeasureCosts() {
  if (!config_.calibrate || ranks_.size() < 2) return;  // one rank has nothing to measure
  AllreduceCalibration measured;
  const Status status = host_plane_->Calibrate(HierarchyByCalibration(config_), &measured);
  if (!status.ok()) {
    Log().error("process set {}: calibration failed ({}); planning with the configured settings",
                id_, status.ToString());
    return;
  }
  if (Log().should_log(spdlog::level::debug)) {
    std::string samples;
    for (const auto* list : {&measured.in_place, &measured.fused, &measured.fused_hierarchical}) {
      for (const CostSample& s : *list) {
        samples += " " + std::to_string(s.tensors) + "x" +
                   std::to_string(int64_t(s.bytes) / s.tensors) +
                   "B=" + std::to_string(int64_t(s.us)) + "us";
      }
      samples += list == &measured.in_place ? "; fused:"
                 : list == &measured.fused && !measured.fused_hierarchical.empty()
                     ? "; hierarchical:"
                     : "";
    }
    Log().debug("process set {}: calibration samples, in place:{}", id_, samples);
  }
  AllreduceCosts costs;
  costs.in_place = FitLinearCost(measured.in_place, kPerByte | kPerTensor);
  costs.fused = FitLinearCost(measured.fused, kFixed | kPerByte | kPerTensor);
  std::string described = DescribeCosts(costs);  // the flat fused path, as measured
  if (!measured.fused_hierarchical.empty()) {
    const LinearCost hierarchical =
        FitLinearCost(measured.fused_hierarchical, kFixed | kPerByte | kPerTensor);
    const int64_t from = HierarchicalFrom(costs.fused, hierarchical);
    host_plane_->set_hierarchical_from_bytes(from);
    if (from == 0) costs.fused = hierarchical;
    described += "; hierarchical " + DescribeCost(hierarchical) +
                 (from == 0 ? ": every bucket goes hierarchical"
                  : from >= kNeverInPlace
                      ? ": every bucket stays flat"
                      : ": buckets of " + DescribeBytes(from) + " and more go hierarchical");
  }
  const int64_t cutoff = InPlaceCutoff(costs);
  double largest = 0;
  for (const CostSample& s : measured.fused) largest = std::max(largest, s.bytes);
  std::string policy = "fused buckets of at most ";
  if (config_.fusion_threshold_pinned) {
    policy += DescribeBytes(fusion_.fusion_threshold_bytes) + " (GRADSYNC_FUSION_THRESHOLD); ";
  } else {
    fusion_.fusion_threshold_bytes = FusedBucketCap(costs, largest, config_.fusion_threshold_bytes);
    policy += DescribeBytes(fusion_.fusion_threshold_bytes) + "; ";
  }
  if (config_.inplace_threshold_pinned) {
    policy += "GRADSYNC_INPLACE_THRESHOLD pins the in-place cutoff at " +
              DescribeBytes(fusion_.inplace_threshold_bytes) + " (the costs say " +
              DescribeBytes(cutoff) + ")";
  } else {
    fusion_.inplace_threshold_bytes = cutoff;
    policy += cutoff >= kNeverInPlace ? "every tensor is fused (none is cheaper alone)"
                                      : "tensors of " + DescribeBytes(cutoff) +
                                            " and more are reduced alone, in place; smaller ones "
                                            "are fused";
  }
  int rank = 0;
  MPI_Comm_rank(data_comm_, &rank);
  if (rank != 0) return;  // every member fitted the same numbers
  Log().info("process set {}: allreduce costs on {} ranks, measured in {:.0f} ms: {}; {}", id_,
             ranks_.size(), measured.seconds * 1e3, described, policy);
}

void ProcessSetRuntime::StartAutotune() {
  if (!config_.autotune || ranks_.size() < 2) return;
  tuning_ = std::make_unique<Tuning>();
  tuning_->tuner = std::make_unique<Autotuner>(
      TunableSettings{fusion_.inplace_threshold_bytes, fusion_.fusion_threshold_bytes,
                      config_.cycle_time_ms},
      config_.fusion_threshold_bytes, id_ == 0);
  int rank = 0;
  MPI_Comm_rank(data_comm_, &rank);
  if (rank != 0) return;
  const std::string path =
      id_ == 0 ? config_.autotune_log : config_.autotune_log + ".set" + std::to_string(id_);
  tuning_->log.open(path, std::ios::out | std::ios::trunc);
  if (!tuning_->log) {
    Log().error("process set {}: GRADSYNC_AUTOTUNE_LOG: cannot write {}; tuning without a log", id_,
                path);
  } else {
    tuning_->log << Autotuner::Header() << std::endl;
  }
}

// A marker that has not come round often enough in this many allreduces is not once per step (an
// allreduce run once, or once an epoch): the next allreduce becomes the marker. After a few such
// tries tuning stops on the starting settings, rather than leave a candidate in place for good.
constexpr int64_t kRunsPerWindowLimit = 20000;
constexpr int kMarkerTries = 3;

void ProcessSetRuntime::ObserveForAutotune(const std::vector<const Response*>& responses) {
  if (tuning_ == nullptr || tuning_->tuner->done()) return;
  Tuning& t = *tuning_;
  for (const Response* r : responses) {
    if (r->type != ResponseType::kAllreduce) continue;
    if (!t.marker.empty() && ++t.runs > kRunsPerWindowLimit) {
      if (++t.remarks >= kMarkerTries) {
        const TunableSettings start = t.tuner->start();
        fusion_.inplace_threshold_bytes = start.inplace_threshold_bytes;
        fusion_.fusion_threshold_bytes = start.fusion_threshold_bytes;
        config_.cycle_time_ms = start.cycle_time_ms;
        Log().warn(
            "process set {}: autotuning found no allreduce that runs once per step; "
            "keeping the calibrated settings",
            id_);
        tuning_.reset();
        return;
      }
      t.marker.clear();
    }
    if (t.marker.empty()) {
      t.marker = r->name;
      t.steps = 0;
      t.runs = 0;
      t.window_start = std::chrono::steady_clock::now();
      return;
    }
    if (r->name != t.marker || ++t.steps < Autotuner::kStepsPerWindow) continue;
    const double mine =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t.window_start).count();
    double slowest = mine;
    const Status reduced =
        MpiResult(MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, data_comm_),
                  "MPI_Allreduce (autotune window)");
    if (!reduced.ok()) {
      Log().error("process set {}: autotuning stopped: {}", id_, reduced.ToString());
      tuning_.reset();
      return;
    }
    const std::string line = t.tuner->Record(slowest);
    if (t.log.is_open()) t.log << line << std::endl;
    const TunableSettings& next = t.tuner->current();
    fusion_.inplace_threshold_bytes = next.inplace_threshold_bytes;
    fusion_.fusion_threshold_bytes = next.fusion_threshold_bytes;
    if (t.tuner->done() && t.log.is_open()) {
      Log().info(
          "process set {}: autotuning settled: in-place cutoff {}, buckets of at most {}, cycle "
          "time {} ms (trajectory in {})",
          id_, DescribeBytes(next.inplace_threshold_bytes),
          DescribeBytes(next.fusion_threshold_bytes), next.cycle_time_ms, config_.autotune_log);
    }
    t.steps = 0;
    t.runs = 0;
    t.window_start = std::chrono::steady_clock::now();
    return;
  }
}

double ProcessSetRuntime::cycle_time_ms() const {
  return tuning_ ? tuning_->tuner->current().cycle_time_ms : config_.cycle_time_ms;
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
  removed_.insert(id);
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
  if (removed_.count(id) != 0) {
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
