// What gradsync itself costs per operation and per bucket, with the locked schedule and with
// negotiation, side by side in one run: the process alternates phases with
// GRADSYNC_LOCKED_SCHEDULE=1 and =0 (init, measure, shutdown), over host tensors, over the host
// device backend (host memory labelled cuda:0 that goes through the device plane and its
// finalizer, as device tensors do on a GPU, with a thread per stream) and over a no-op device
// backend whose work is done once enqueued (gradsync's own host path per operation, what a GPU
// run adds its launches and kernels to), beside raw MPI on the same bytes.
//
//   mpirun -np N gradsync_bench_launch [--phases P] [--iters N] [--tensors T]
//                                      [--tensor-bytes B] [--bucket-bytes B] [--gap-us G]
//                                      [--one-bytes B]
//
// Rows, each a median over the timed steps of a phase (the slowest rank's, from a barrier):
//   one op   one allreduce of --one-bytes (16), enqueued and waited on: what a caller that waits
//            on each result pays. Raw: MPI_Allreduce of the same bytes. With larger sizes an
//            operation stays in flight long enough for the finalizer to sleep before it completes.
//   one group  two allreduces of --one-bytes in one grouped call, waited on (a compressed DDP
//            bucket's path). Raw: one MPI_Allreduce of both packed together.
//   one op ordered  (device rows) the same, stream-ordered with Handle::synchronize_stream, as
//            gradsync.torch's hooks consume device results: its wait for the launch.
//   step     T tensors of B bytes enqueued in a burst and then waited on, fused into buckets of
//            --bucket-bytes: "per bucket" is the step over its buckets. Raw: for each bucket,
//            copy in, MPI_Allreduce, copy out.
//   backward the step's tensors one at a time, each after G us of busy work, as a backward pass
//            hands them over. Raw: the same work, each bucket reduced as above once its last
//            tensor is there, on the caller's thread.
//   backward flat  (device rows) the backward with the tensors as views into one buffer, back to
//            back in the order they come: each bucket reduced where it lies. Raw: the same
//            layout, each bucket's MPI_Allreduce in place once its last tensor is there.
//   step + unnamed  the step, then one allreduce of --one-bytes enqueued without a name and
//            waited on, as a loop averages its loss: its generated name is new every step. Raw:
//            the step's, then one MPI_Allreduce.
//   step + unnamed group  the step, then two metrics of --one-bytes in one grouped allreduce
//            without names, waited on: the group is known by its first member's generated name.
//            Raw: the step's, then one MPI_Allreduce of both metrics packed together.
// Before each phase's timing, a warm-up with the timeline on tells whether the schedule locked.
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "gradsync/gradsync.h"
#include "ops/device/device_plane.h"
#include "ops/device/device_plane_factory.h"

namespace gradsync_bench {
namespace {

using gradsync::DataType;
using gradsync::Handle;
using gradsync::TensorView;

struct Settings {
  int phases = 4;  // alternating locked and negotiated
  int iters = 200;
  int64_t tensors = 64;
  int64_t tensor_bytes = 1024;
  int64_t bucket_bytes = 16384;
  int64_t gap_us = 20;     // busy work before each tensor of the backward rows
  int64_t one_bytes = 16;  // each one-op row's allreduce
};

// A device backend whose work is done the moment it is enqueued: the device rows then time
// gradsync's own host path (the API, the cycle, the plane's bookkeeping, the finalizer and the
// handle) with no stream thread in between. Its collectives move no data.
class DoneEvent : public gradsync::StreamEvent {
 public:
  bool Query() override { return true; }
  gradsync::Status Wait(std::chrono::nanoseconds) override { return gradsync::Status::OK(); }
};

class DoneStream : public gradsync::Stream {
 public:
  std::shared_ptr<gradsync::StreamEvent> Record() override { return done_; }
  void WaitFor(std::shared_ptr<gradsync::StreamEvent>) override {}
  void Abort(const gradsync::Status&) override {}

 private:
  std::shared_ptr<gradsync::StreamEvent> done_ = std::make_shared<DoneEvent>();
};

class NoOpBackend : public gradsync::DeviceBackend {
 public:
  NoOpBackend(int rank, int size) : rank_(rank), size_(size) {}
  const char* name() const override { return "no-op"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  gradsync::Stream* stream() override { return &stream_; }
  gradsync::Status Allocate(size_t bytes, void** ptr) override {
    *ptr = ::operator new(bytes == 0 ? 1 : bytes);
    return gradsync::Status::OK();
  }
  void FreeAfterWork(void* ptr) override { ::operator delete(ptr); }
  gradsync::Status Upload(const void*, void*, size_t) override { return gradsync::Status::OK(); }
  gradsync::Status BatchedCopy(const std::vector<gradsync::CopySegment>&, DataType) override {
    return gradsync::Status::OK();
  }
  gradsync::Status Allreduce(const void*, void*, int64_t, DataType, gradsync::ReduceOp) override {
    return gradsync::Status::OK();
  }
  gradsync::Status Allgatherv(const void*, void*, const std::vector<int64_t>&, DataType) override {
    return gradsync::Status::OK();
  }
  gradsync::Status Broadcast(void*, int64_t, DataType, int) override {
    return gradsync::Status::OK();
  }
  gradsync::Status Alltoallv(const void*, const std::vector<int64_t>&, void*,
                             const std::vector<int64_t>&, DataType) override {
    return gradsync::Status::OK();
  }
  gradsync::Status ReduceScatterv(const void*, void*, const std::vector<int64_t>&, DataType,
                                  gradsync::ReduceOp) override {
    return gradsync::Status::OK();
  }
  gradsync::Status Adasum(void*, DataType, int64_t, const std::vector<gradsync::ElementRange>&,
                          double, double) override {
    return gradsync::Status::OK();
  }
  gradsync::Status CheckAsyncError() override { return gradsync::Status::OK(); }
  void Abort(const gradsync::Status&) override {}

 private:
  int rank_;
  int size_;
  DoneStream stream_;
};

gradsync::Status NoOpPlane(const gradsync::Config& config, MPI_Comm comm, const gradsync::Device&,
                           std::unique_ptr<gradsync::DataPlane>* plane) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  *plane = std::make_unique<gradsync::DevicePlane>(std::make_unique<NoOpBackend>(rank, size), comm,
                                                   gradsync::DeviceCompletionTimeout(config));
  return gradsync::Status::OK();
}

// Busy work standing in for a layer's backward.
void Compute(double us) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(us * 1e3));
  while (std::chrono::steady_clock::now() < until) {
  }
}

// A workload's tensors, named by `prefix`, on the host or labelled as a device's.
class Workload {
 public:
  // `flat`: the tensors are views into one buffer, back to back in the order they are enqueued.
  Workload(const std::string& prefix, int64_t tensors, int64_t floats, bool device, int rank,
           bool flat = false)
      : data_(flat ? 1 : tensors, std::vector<float>(flat ? tensors * floats : floats)) {
    for (int64_t t = 0; t < tensors; ++t) {
      float* data = flat ? data_[0].data() + t * floats : data_[t].data();
      FillPattern(data, floats, t, rank);
      TensorView view(data, DataType::kFloat32, {floats});
      if (device) view.device = gradsync::Device::Cuda(0);
      views_.push_back(view);
      options_.emplace_back();
      options_.back().name = prefix + "." + std::to_string(t);
      group_.names.push_back(options_.back().name);
    }
    handles_.resize(tensors);
  }

  // Every tensor enqueued, each `gap_us` of busy work after the one before (a backward pass's
  // layers), then all waited on.
  void Step(double gap_us = 0) {
    for (size_t t = 0; t < views_.size(); ++t) {
      if (gap_us > 0) Compute(gap_us);
      handles_[t] = gradsync::allreduce(views_[t], options_[t]);
    }
    for (Handle& h : handles_) h.wait();
  }

  // The step, then an unnamed allreduce of the first tensor's first `metric_floats` floats,
  // waited on.
  void StepWithUnnamed(int64_t metric_floats) {
    Step();
    TensorView metric = views_.front();
    metric.shape = {metric_floats};
    gradsync::allreduce(metric, gradsync::AllreduceOptions()).wait();
  }

  // Every tensor in one grouped allreduce under the workload's names, then all waited on.
  void Group() {
    for (Handle& h : gradsync::grouped_allreduce(views_, group_)) h.wait();
  }

  // The step, then the first two tensors' first `metric_floats` floats each in one unnamed
  // group, waited on.
  void StepWithUnnamedGroup(int64_t metric_floats) {
    Step();
    std::vector<TensorView> metrics(views_.begin(), views_.begin() + 2);
    for (TensorView& metric : metrics) metric.shape = {metric_floats};
    for (Handle& h : gradsync::grouped_allreduce(metrics)) h.wait();
  }

  // One tensor enqueued, its handle stream-ordered (as PyTorch's hooks consume device results)
  // rather than waited for: the host blocks only until the work is launched. The device planes
  // here record host events, on which the order is a host wait. Calls take the tensors in turn:
  // a name enqueued again before the finalizer has completed its last operation would wait for
  // that, which a training step's next use of a name never does.
  void StepOrdered() {
    const size_t t = next_++ % views_.size();
    handles_[t] = gradsync::allreduce(views_[t], options_[t]);
    handles_[t].synchronize_stream(&consumer_stream_);
  }

 private:
  int consumer_stream_ = 0;  // stands in for a cudaStream_t
  size_t next_ = 0;
  std::vector<std::vector<float>> data_;
  std::vector<TensorView> views_;
  std::vector<gradsync::AllreduceOptions> options_;
  gradsync::GroupedAllreduceOptions group_;
  std::vector<Handle> handles_;
};

// Copy in, one MPI_Allreduce and copy out per bucket: the raw strategy for small tensors. Or,
// `flat`, the tensors back to back in one buffer, each bucket reduced where it lies.
class RawBuckets {
 public:
  RawBuckets(int64_t tensors, int64_t floats, int64_t per_bucket, MPI_Comm comm, bool flat = false)
      : data_(tensors, std::vector<float>(floats, 1.0f)),
        per_bucket_(per_bucket),
        buffer_(per_bucket * floats),
        flat_(flat ? tensors * floats : 0, 1.0f),
        comm_(comm) {}

  // With `gap_us`, each tensor comes after that much busy work and a bucket is reduced as soon as
  // its last tensor has come, on this thread.
  void Step(double gap_us = 0) {
    const int64_t floats = static_cast<int64_t>(data_[0].size());
    for (size_t first = 0; first < data_.size(); first += per_bucket_) {
      const size_t last = std::min(data_.size(), first + per_bucket_);
      const int64_t count = static_cast<int64_t>(last - first) * floats;
      for (size_t t = first; t < last; ++t) {
        if (gap_us > 0) Compute(gap_us);
        if (flat_.empty()) {
          std::memcpy(buffer_.data() + (t - first) * floats, data_[t].data(), floats * 4);
        }
      }
      if (!flat_.empty()) {
        AllreduceFloats(flat_.data() + first * floats, count, comm_);
        continue;
      }
      AllreduceFloats(buffer_.data(), count, comm_);
      for (size_t t = first; t < last; ++t) {
        std::memcpy(data_[t].data(), buffer_.data() + (t - first) * floats, floats * 4);
      }
    }
  }

 private:
  std::vector<std::vector<float>> data_;
  size_t per_bucket_;
  std::vector<float> buffer_;
  std::vector<float> flat_;
  MPI_Comm comm_;
};

// How many times rank 0's timeline file says the global set locked and left its lock; whether
// the last of those was a lock. Every rank gets rank 0's answer.
std::string LockState(const std::string& path, int rank) {
  int counts[3] = {0, 0, 0};  // locks, unlocks, last was a lock
  if (rank == 0) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (size_t at = s.find("LOCK set 0"); at != std::string::npos;
         at = s.find("LOCK set 0", at + 1)) {
      const bool unlock = at >= 2 && s.compare(at - 2, 2, "UN") == 0;
      ++counts[unlock ? 1 : 0];
      counts[2] = unlock ? 0 : 1;
    }
    std::remove(path.c_str());
  }
  MPI_Bcast(counts, 3, MPI_INT, 0, MPI_COMM_WORLD);
  return std::string(counts[2] ? "locked" : "not locked") + " (" + std::to_string(counts[0]) +
         " locks, " + std::to_string(counts[1]) + " unlocks)";
}

struct Row {
  std::string name;
  double raw = 0;
  double gradsync = 0;
  std::string state;
};

// Times `gradsync_step` against `raw_step`, after a warm-up with the timeline on.
Row Measure(const std::string& name, const std::function<void()>& raw_step,
            const std::function<void()>& gradsync_step, const Settings& settings, int rank) {
  const std::string trace = (std::filesystem::temp_directory_path() /
                             ("gradsync_bench_launch_" + std::to_string(getpid()) + ".json"))
                                .string();
  MPI_Comm raw_comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm);
  gradsync::start_timeline(trace);
  // Enough for the ordered row's rotation of four names to make the three identical steps that
  // lock, and the lock's round after them.
  MeasureInterleaved({{"warm", gradsync_step}}, 24, 1, MPI_COMM_WORLD);
  gradsync::stop_timeline();
  Row row;
  row.name = name;
  row.state = LockState(trace, rank);
  const std::vector<double> medians = MeasureInterleaved(
      {{"raw", raw_step}, {"gradsync", gradsync_step}}, 3, settings.iters, MPI_COMM_WORLD);
  row.raw = medians[0];
  row.gradsync = medians[1];
  MPI_Comm_free(&raw_comm);
  return row;
}

// Each set of rows under an init of its own: host tensors, device tensors over the host backend
// (a thread per stream), and device tensors over the no-op backend.
std::vector<Row> RunPhase(bool locked, const Settings& settings, int rank) {
  setenv("GRADSYNC_LOCKED_SCHEDULE", locked ? "1" : "0", 1);
  MPI_Comm raw_comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm);
  const int64_t floats = settings.tensor_bytes / 4;
  const int64_t per_bucket = std::max<int64_t>(1, settings.bucket_bytes / settings.tensor_bytes);
  const int64_t one_floats = std::max<int64_t>(1, settings.one_bytes / 4);
  std::vector<float> one_raw(one_floats, 1.0f);
  auto raw_one = [&] { AllreduceFloats(one_raw.data(), one_floats, raw_comm); };
  RawBuckets raw_buckets(settings.tensors, floats, per_bucket, raw_comm);
  std::vector<Row> rows;
  const char* wheres[] = {"host", "device(host backend)", "device(no-op backend)"};
  for (int w = 0; w < 3; ++w) {
    const bool device = w > 0;
    const std::string where = wheres[w];
    const std::string tag = std::to_string(w);
    gradsync::SetDevicePlaneFactoryForTesting(w == 2 ? &NoOpPlane
                                                     : &gradsync::MakeHostBackedDevicePlane);
    gradsync::init(MPI_COMM_WORLD);
    Workload one("one." + tag, 1, one_floats, device, rank);
    rows.push_back(Measure(
        "one op, " + where, raw_one, [&] { one.Step(); }, settings, rank));
    std::vector<float> two_raw(2 * one_floats, 1.0f);
    auto raw_two = [&] { AllreduceFloats(two_raw.data(), 2 * one_floats, raw_comm); };
    Workload pair("pair." + tag, 2, one_floats, device, rank);
    rows.push_back(Measure(
        "one group, " + where, raw_two, [&] { pair.Group(); }, settings, rank));
    if (device) {
      Workload ordered("ordered." + tag, 4, one_floats, device, rank);
      rows.push_back(Measure(
          "one op ordered, " + where, raw_one, [&] { ordered.StepOrdered(); }, settings, rank));
    }
    Workload step("step." + tag, settings.tensors, floats, device, rank);
    rows.push_back(Measure(
        "step, " + where, [&] { raw_buckets.Step(); }, [&] { step.Step(); }, settings, rank));
    Workload backward("backward." + tag, settings.tensors, floats, device, rank);
    const double gap = settings.gap_us;
    rows.push_back(Measure(
        "backward, " + where, [&] { raw_buckets.Step(gap); }, [&] { backward.Step(gap); }, settings,
        rank));
    if (device) {
      RawBuckets raw_flat(settings.tensors, floats, per_bucket, raw_comm, /*flat=*/true);
      Workload flat("flat." + tag, settings.tensors, floats, device, rank, /*flat=*/true);
      rows.push_back(Measure(
          "backward flat, " + where, [&] { raw_flat.Step(gap); }, [&] { flat.Step(gap); }, settings,
          rank));
    }
    Workload unnamed("unnamed." + tag, settings.tensors, floats, device, rank);
    rows.push_back(Measure(
        "step + unnamed, " + where,
        [&] {
          raw_buckets.Step();
          raw_one();
        },
        [&] { unnamed.StepWithUnnamed(std::min(one_floats, floats)); }, settings, rank));
    if (settings.tensors >= 2) {
      Workload grouped("grouped." + tag, settings.tensors, floats, device, rank);
      rows.push_back(Measure(
          "step + unnamed group, " + where,
          [&] {
            raw_buckets.Step();
            raw_two();
          },
          [&] { grouped.StepWithUnnamedGroup(std::min(one_floats, floats)); }, settings, rank));
    }
    gradsync::shutdown();
  }
  MPI_Comm_free(&raw_comm);
  return rows;
}

int Run(int argc, char** argv) {
  Flags flags(argc, argv,
              {"--phases", "--iters", "--tensors", "--tensor-bytes", "--bucket-bytes", "--gap-us",
               "--one-bytes"});
  Settings settings;
  settings.phases = static_cast<int>(flags.GetInt("--phases", settings.phases, 2));
  settings.iters = static_cast<int>(flags.GetInt("--iters", settings.iters, 1));
  settings.tensors = flags.GetInt("--tensors", settings.tensors, 1);
  settings.tensor_bytes = flags.GetInt("--tensor-bytes", settings.tensor_bytes, 4);
  settings.bucket_bytes = flags.GetInt("--bucket-bytes", settings.bucket_bytes, 4);
  settings.gap_us = flags.GetInt("--gap-us", settings.gap_us, 0);
  settings.one_bytes = flags.GetInt("--one-bytes", settings.one_bytes, 4);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Fixed settings, the same in every phase: buckets of --bucket-bytes, no calibration.
  setenv("GRADSYNC_CALIBRATE", "0", 1);
  setenv("GRADSYNC_FUSION_THRESHOLD", std::to_string(settings.bucket_bytes).c_str(), 1);
  const int64_t buckets = (settings.tensors + settings.bucket_bytes / settings.tensor_bytes - 1) /
                          std::max<int64_t>(1, settings.bucket_bytes / settings.tensor_bytes);
  if (rank == 0) {
    std::printf(
        "# gradsync_bench_launch: %d ranks, %lld tensors of %lld B a step, buckets of "
        "%lld B (%lld a step), one-op rows of %lld B, %d timed steps a phase\n",
        size, static_cast<long long>(settings.tensors),
        static_cast<long long>(settings.tensor_bytes),
        static_cast<long long>(settings.bucket_bytes), static_cast<long long>(buckets),
        static_cast<long long>(settings.one_bytes), settings.iters);
    std::printf("%-6s %-10s %-44s %10s %12s %9s %12s  %s\n", "phase", "schedule", "row", "raw_us",
                "gradsync_us", "gs/raw", "per_bucket", "state");
  }
  std::vector<std::string> names;
  std::vector<std::vector<double>> ratios[2];  // [locked][row]: gs/raw of each phase
  for (int phase = 0; phase < settings.phases; ++phase) {
    const bool locked = phase % 2 == 0;
    const std::vector<Row> rows = RunPhase(locked, settings, rank);
    names.resize(rows.size());
    ratios[0].resize(rows.size());
    ratios[1].resize(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      names[r] = rows[r].name;
      ratios[locked][r].push_back(rows[r].gradsync / (rows[r].raw > 0 ? rows[r].raw : 1));
      if (rank != 0) continue;
      const bool is_step = rows[r].name.rfind("one ", 0) != 0;
      std::printf("%-6d %-10s %-44s %10.1f %12.1f %9.2f %12.1f  %s\n", phase,
                  locked ? "locked" : "negotiated", rows[r].name.c_str(), rows[r].raw * 1e6,
                  rows[r].gradsync * 1e6, rows[r].gradsync / rows[r].raw,
                  rows[r].gradsync * 1e6 / (is_step ? buckets : 1), rows[r].state.c_str());
    }
  }
  if (rank == 0) {
    std::printf("# median gs/raw over phases: row, locked, negotiated, locked/negotiated\n");
    for (size_t r = 0; r < names.size(); ++r) {
      const double l = Median(ratios[1][r]);
      const double n = Median(ratios[0][r]);
      std::printf("# %-44s %6.2f %6.2f %6.2f\n", names[r].c_str(), l, n, l / n);
    }
  }
  return 0;
}

}  // namespace
}  // namespace gradsync_bench

int main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 1;
  try {
    status = gradsync_bench::Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsync_bench_launch: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
