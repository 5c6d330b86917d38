// ProcessSetRuntime's fusion policy: calibration of the set's host allreduce paths at its first
// host allreduce (coordinator/cost_model.h) and, with GRADSYNC_AUTOTUNE, the tuning that follows
// (coordinator/autotuner.h). Kept apart from the set's bookkeeping in process_sets.cc.
#include <algorithm>
#include <chrono>
#include <string>

#include "coordinator/cost_model.h"
#include "coordinator/process_sets.h"
#include "runtime/logging.h"

namespace gradsync {
namespace {

// A fused bucket's cost has three terms to fit: fixed, per byte and per tensor.
constexpr size_t kFewestSizesToFit = 3;

}  // namespace

void ProcessSetRuntime::Calibrate() {
  calibrated_ = true;
  AgreeOnPieces();
  MeasureCosts();
  StartAutotune();
}

int64_t ProcessSetRuntime::allreduce_piece_bytes() const { return host_plane_->piece_bytes(); }

bool ProcessSetRuntime::last_allreduce_shared() const {
  return host_plane_->last_allreduce_shared();
}

void ProcessSetRuntime::AgreeOnPieces() {
  if (ranks_.size() < 2) return;
  const bool pinned = config_.allreduce_piece_pinned;
  int64_t mine[2] = {pinned ? config_.allreduce_piece_bytes : INT64_MAX, pinned ? 0 : 1};
  int64_t agreed[2] = {0, 0};
  const Status status = MpiResult(MPI_Allreduce(mine, agreed, 2, MPI_INT64_T, MPI_MIN, data_comm_),
                                  "MPI_Allreduce (allreduce piece size)");
  if (!status.ok()) {
    Log().error("process set {}: {}", id_, status.ToString());
    return;
  }
  if (agreed[1] == 1) return;  // no rank pinned it: calibration chooses, for every rank alike
  if (!pinned || agreed[0] != config_.allreduce_piece_bytes) {
    Log().warn(
        "process set {}: GRADSYNC_ALLREDUCE_PIECE_BYTES differs between ranks; every rank uses "
        "the smallest set, {}",
        id_, agreed[0] > 0 ? DescribeBytes(agreed[0]) : std::string("0 (whole)"));
  }
  config_.allreduce_piece_pinned = true;
  config_.allreduce_piece_bytes = agreed[0];
  host_plane_->set_piece_bytes(agreed[0]);
}

bool ProcessSetRuntime::SettlePieces(std::string* policy) {
  *policy = "MPI allreduces ";
  if (config_.allreduce_piece_pinned) {
    *policy += config_.allreduce_piece_bytes > 0
                   ? "in pieces of " + DescribeBytes(config_.allreduce_piece_bytes)
                   : std::string("whole");
    *policy += " (GRADSYNC_ALLREDUCE_PIECE_BYTES)";
    return true;
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<PieceSample> samples;
  const Status probed = host_plane_->CalibratePieces(&samples);
  if (!probed.ok()) {
    Log().error("process set {}: calibration failed ({}); planning with the configured settings",
                id_, probed.ToString());
    return false;
  }
  if (Log().should_log(spdlog::level::debug)) {
    std::string timed;
    for (const PieceSample& s : samples) {
      timed += " " + (s.piece_bytes > 0 ? DescribeBytes(s.piece_bytes) : std::string("whole")) +
               "=" + std::to_string(int64_t(s.us)) + "us";
    }
    Log().debug(
        "process set {}: piece probe of {} in {:.0f} ms:{}", id_, DescribeBytes(kPieceProbeBytes),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
        timed);
  }
  const int64_t chosen = ChoosePieceBytes(samples);
  host_plane_->set_piece_bytes(chosen);
  *policy += DescribePieceChoice(samples, chosen);
  return true;
}

void ProcessSetRuntime::MeasureCosts() {
  if (!config_.calibrate || ranks_.size() < 2) return;  // one rank has nothing to measure
  const auto start = std::chrono::steady_clock::now();
  // Pieces first: the ladder then times the paths as they will run.
  std::string pieces;
  if (!SettlePieces(&pieces)) return;
  AllreduceCalibration measured;
  const Status status = host_plane_->Calibrate(HierarchyByCalibration(config_), &measured,
                                               config_.calibration_seconds);
  if (!status.ok()) {
    Log().error("process set {}: calibration failed ({}); planning with the configured settings",
                id_, status.ToString());
    return;
  }
  int rank = 0;
  MPI_Comm_rank(data_comm_, &rank);
  if (measured.fused.size() < kFewestSizesToFit) {
    if (rank == 0) {
      Log().warn(
          "process set {}: calibration timed {} of its {} sizes in {:.1f} s, too few to fit costs "
          "from (the next would have overrun its budget of {} s, GRADSYNC_CALIBRATION_SECONDS); "
          "planning with the configured settings. The ranks may share too few cores, or their "
          "network be slow; GRADSYNC_CALIBRATE=0 skips calibration",
          id_, measured.fused.size(), measured.fused.size() + measured.sizes_skipped,
          measured.seconds, measured.budget_seconds);
    }
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
  double largest = 0;
  for (const CostSample& s : measured.fused) largest = std::max(largest, s.bytes);
  std::string policy = "fused buckets of at most ";
  if (config_.fusion_threshold_pinned) {
    policy += DescribeBytes(fusion_.fusion_threshold_bytes) + " (GRADSYNC_FUSION_THRESHOLD); ";
  } else {
    fusion_.fusion_threshold_bytes =
        FusedBucketCap(costs, largest, config_.fusion_threshold_bytes, config_.cache_bytes);
    policy += DescribeBytes(fusion_.fusion_threshold_bytes) + "; ";
  }
  const int64_t crossing = InPlaceCutoff(costs);
  const int64_t cutoff = PlannedInPlaceCutoff(costs, fusion_.fusion_threshold_bytes);
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
    if (cutoff < crossing)
      policy += " (a bucket's cap: the costs alone say " + DescribeBytes(crossing) + ")";
  }
  if (rank != 0) return;  // every member fitted the same numbers
  const std::string skipped =
      measured.sizes_skipped == 0
          ? std::string()
          : " (its " + std::to_string(measured.sizes_skipped) +
                " largest sizes left out to stay within GRADSYNC_CALIBRATION_SECONDS)";
  Log().info(
      "process set {}: allreduce costs on {} ranks, measured in {:.0f} ms{}: {}; {}; {}", id_,
      ranks_.size(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
      skipped, described, policy, pieces);
}

void ProcessSetRuntime::StartAutotune() {
  if (!config_.autotune || ranks_.size() < 2) return;
  tuning_ = std::make_unique<Tuning>();
  TunedParameters tuned;
  tuned.inplace_threshold = !config_.inplace_threshold_pinned;
  tuned.fusion_threshold = !config_.fusion_threshold_pinned;
  tuned.cycle_time = id_ == 0;
  tuning_->tuner = std::make_unique<Autotuner>(
      TunableSettings{fusion_.inplace_threshold_bytes, fusion_.fusion_threshold_bytes,
                      config_.cycle_time_ms},
      config_.fusion_threshold_bytes, tuned);
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

namespace {

// A marker that has not come round often enough in this many allreduces is not once per step (an
// allreduce run once, or once an epoch): the next allreduce becomes the marker. After a few such
// tries tuning stops on the starting settings, rather than leave a candidate in place for good.
constexpr int64_t kRunsPerWindowLimit = 20000;
constexpr int kMarkerTries = 3;

}  // namespace

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

bool ProcessSetRuntime::tuning() const { return tuning_ != nullptr && !tuning_->tuner->done(); }

double ProcessSetRuntime::cycle_time_ms() const {
  return tuning_ ? tuning_->tuner->current().cycle_time_ms : config_.cycle_time_ms;
}

}  // namespace gradsync
