// The soak's bookkeeping, output and watchdog; see soak_report.h.
#include "test/soak/soak_report.h"

#include <gradsync/gradsync.h>
#include <mpi.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

namespace gradsync {
namespace soak {
namespace {

constexpr int kSampleFields = 8;

double Mib(int64_t kib) { return static_cast<double>(kib) / 1024.0; }

int64_t FileBytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// Gathers one string per rank on rank 0, in rank order.
std::vector<std::string> GatherStrings(const std::string& mine, int rank, int size) {
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[static_cast<size_t>(r)] = total;
    total += lengths[static_cast<size_t>(r)];
  }
  std::string all(static_cast<size_t>(rank == 0 ? total : 0), '\0');
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank == 0) {
    for (int r = 0; r < size; ++r) {
      out.push_back(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                               static_cast<size_t>(lengths[static_cast<size_t>(r)])));
    }
  }
  return out;
}

}  // namespace

Report::Report(int rank, int size, const Options& options)
    : rank_(rank), size_(size), options_(options), start_(std::chrono::steady_clock::now()) {}

void Report::Fail(const std::string& why) {
  failed_ = true;
  std::fprintf(stderr, "soak rank %d: FAIL %s\n", rank_, why.c_str());
}

void Report::Sample(int64_t step, const Tally* tally) {
  ProcessSample s = SampleProcess(step);
  s.timeline_open = window_open_;
  mine_.push_back(s);
  const int64_t fields[kSampleFields] = {s.step, s.rss_kib, s.anon_kib, s.shmem_kib,
                                         s.fds,  s.threads, s.maps,     s.heap_kib};
  std::vector<int64_t> gathered(static_cast<size_t>(kSampleFields * size_));
  MPI_Gather(fields, kSampleFields, MPI_INT64_T, gathered.data(), kSampleFields, MPI_INT64_T, 0,
             MPI_COMM_WORLD);
  if (rank_ != 0) return;
  std::vector<ProcessSample> row;
  for (int r = 0; r < size_; ++r) {
    const int64_t* f = &gathered[static_cast<size_t>(kSampleFields * r)];
    row.push_back({f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]});
  }
  all_.push_back(row);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::ostringstream line;
  line.precision(1);
  line << std::fixed << "soak step " << step << "/" << options_.steps << " at " << seconds
       << " s: rss MiB";
  for (const ProcessSample& p : row) line << ' ' << Mib(p.rss_kib);
  line << " (anon";
  for (const ProcessSample& p : row) line << ' ' << Mib(p.anon_kib);
  line << ", shmem";
  for (const ProcessSample& p : row) line << ' ' << Mib(p.shmem_kib);
  line << "), heap MiB";
  for (const ProcessSample& p : row) line << ' ' << Mib(p.heap_kib);
  line << ", fds";
  for (const ProcessSample& p : row) line << ' ' << p.fds;
  line << ", threads";
  for (const ProcessSample& p : row) line << ' ' << p.threads;
  line << ", maps";
  for (const ProcessSample& p : row) line << ' ' << p.maps;
  if (tally) line << ", rank 0 ops " << tally->ops << " bytes " << tally->bytes;
  const char* timeline = std::getenv("GRADSYNC_TIMELINE");
  if (timeline && options_.timeline == TimelineMode::kWhole) {
    line << ", timeline bytes " << FileBytes(timeline);
  }
  std::printf("%s\n", line.str().c_str());
  std::fflush(stdout);
}

void Report::StartWindow(const std::string& dir, int64_t step) {
  window_step_ = step;
  window_path_ = dir + "/window_" + std::to_string(step) + ".json";
  window_open_ = true;
  try {
    start_timeline(window_path_);
  } catch (const Error& e) {
    Fail("start_timeline at step " + std::to_string(step) + " threw " + e.what());
  }
}

void Report::StopWindow() {
  if (!window_open_) return;
  window_open_ = false;
  try {
    stop_timeline();
  } catch (const Error& e) {
    Fail("stop_timeline threw " + std::string(e.what()));
  }
  if (rank_ != 0) return;
  const TimelineReport t = CheckTimeline(window_path_);
  if (!t.ok) Fail("timeline window from step " + std::to_string(window_step_) + ": " + t.why);
  ++windows_;
  window_bytes_max_ = std::max(window_bytes_max_, t.bytes);
  window_bytes_total_ += t.bytes;
  window_events_ += t.events;
  if (t.dropped)
    std::printf("soak: timeline window from step %lld dropped events\n",
                static_cast<long long>(window_step_));
  if (!options_.keep_timeline) std::filesystem::remove(window_path_);
}

void Report::CheckGrowth() {
  // The first sample at or after the warm-up is the baseline; later samples may not exceed it by
  // more than the bounds (memory) or at all (descriptors, threads).
  const int64_t warm = static_cast<int64_t>(static_cast<double>(options_.steps) * options_.warmup);
  const auto base = std::find_if(mine_.begin(), mine_.end(), [warm](const ProcessSample& s) {
    return s.step >= warm && !s.timeline_open;
  });
  if (base == mine_.end() || base + 1 == mine_.end()) return;
  ProcessSample most;  // the largest growth of each field over the baseline
  // Node shared memory is left out of the resident bound: its segments grow with the largest
  // bucket seen, up to twice GRADSYNC_SHM_THRESHOLD per rank, whenever a larger one first comes.
  // So is the stand-in device memory (device tensors over the host backend): a set's fusion
  // buffers grow the same way, and on a GPU they are not host memory.
  const auto private_kib = [](const ProcessSample& s) {
    return s.rss_kib - s.shmem_kib - s.device_kib;
  };
  const auto heap_kib = [](const ProcessSample& s) { return s.heap_kib - s.device_kib; };
  for (auto it = base; it != mine_.end(); ++it) {
    most.rss_kib = std::max(most.rss_kib, private_kib(*it) - private_kib(*base));
    most.heap_kib = std::max(most.heap_kib, heap_kib(*it) - heap_kib(*base));
    if (it->timeline_open) continue;
    most.fds = std::max(most.fds, it->fds - base->fds);
    most.threads = std::max(most.threads, it->threads - base->threads);
  }
  growth_ = most;
  growth_base_ = base->step;
  auto over = [&](const char* what, int64_t kib, double bound) {
    std::ostringstream why;
    why.precision(2);
    why << std::fixed << what << " grew by " << Mib(kib) << " MiB after step " << base->step
        << " (bound " << bound << " MiB)";
    Fail(why.str());
  };
  if (options_.memory_bounds && Mib(most.rss_kib) > options_.rss_bound_mib)
    over("resident memory outside node shared memory and stand-in device memory", most.rss_kib,
         options_.rss_bound_mib);
  if (options_.memory_bounds && Mib(most.heap_kib) > options_.heap_bound_mib)
    over("malloc's bytes in use outside stand-in device memory", most.heap_kib,
         options_.heap_bound_mib);
  if (most.fds > 0)
    Fail("open descriptors grew by " + std::to_string(most.fds) + " after the warm-up");
  if (most.threads > 0)
    Fail("threads grew by " + std::to_string(most.threads) + " after the warm-up");
}

std::string Report::SummaryLine(const Tally* tally) const {
  std::ostringstream line;
  line.precision(1);
  line << std::fixed << "soak rank " << rank_ << ": ";
  if (tally) {
    line << "steps " << tally->steps << ", ops " << tally->ops << ", bytes " << tally->bytes
         << ", callbacks " << tally->callbacks << ", join steps " << tally->joins << ", added sets "
         << tally->added_sets << ", ";
    if (options_.steady_steps > 0) {
      line << "steady steps " << tally->steady_steps << ", steps after a stretch:";
      for (int d = 0; d < kDeviations; ++d) {
        line << (d ? ", " : " ") << DeviationName(static_cast<Deviation>(d)) << " "
             << tally->deviations[d];
      }
      line << ", ";
    }
  }
  line << "errors " << (failed_ ? "YES" : "0");
  if (!mine_.empty()) {
    const ProcessSample& first = mine_.front();
    const ProcessSample& last = mine_.back();
    int64_t high = 0;
    for (const ProcessSample& s : mine_) high = std::max(high, s.rss_kib);
    line << ", rss MiB first/last/max " << Mib(first.rss_kib) << "/" << Mib(last.rss_kib) << "/"
         << Mib(high) << ", heap MiB " << Mib(first.heap_kib) << "->" << Mib(last.heap_kib);
    if (last.device_kib > 0) {
      line << ", device memory MiB " << Mib(first.device_kib) << "->" << Mib(last.device_kib);
    }
    if (growth_base_ >= 0) {
      line << ", growth after step " << growth_base_ << ": rss but shmem and device memory "
           << Mib(growth_.rss_kib) << " MiB, heap but device memory " << Mib(growth_.heap_kib)
           << " MiB";
    }
    line << ", fds " << first.fds << "->" << last.fds << ", threads " << first.threads << "->"
         << last.threads << ", maps " << first.maps << "->" << last.maps;
  }
  const StepArena& arena = StepArena::Get();
  line << ", step arena high-water MiB " << Mib(static_cast<int64_t>(arena.high_water() / 1024));
  if (arena.overflows() > 0) line << " (" << arena.overflows() << " buffers on the heap)";
  return line.str();
}

int Report::Finish(const Tally* tally, const std::string& timeline_file, const std::string& dir,
                   bool keep_timeline) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (!failed_) CheckGrowth();
  std::string timeline_line;
  if (rank_ == 0 && !timeline_file.empty()) {
    const TimelineReport t = CheckTimeline(timeline_file);
    if (!t.ok) Fail("timeline " + timeline_file + ": " + t.why);
    timeline_line = "soak timeline (whole run): " + std::to_string(t.bytes) + " bytes, " +
                    std::to_string(t.events) + " events, " + std::to_string(t.cycles) +
                    " cycle markers, " + std::to_string(t.locks) + " locks, " +
                    std::to_string(t.unlocks) + " unlocks, " + std::to_string(t.locked_tensors) +
                    " tensors run locked, " + (t.dropped ? "events DROPPED" : "none dropped") +
                    (t.ok ? ", complete JSON" : ", INVALID");
    // Rank 0 traces every set its rank is in: the global set's locks are all here.
    if (t.ok && options_.steady_steps > 0 && (t.locks == 0 || t.locked_tensors == 0)) {
      Fail("the steady mode's stretches never ran locked (" + std::to_string(t.locks) + " locks, " +
           std::to_string(t.locked_tensors) + " tensors run locked)");
    }
  } else if (rank_ == 0 && windows_ > 0) {
    timeline_line = "soak timeline (windows of " + std::to_string(options_.window) +
                    " steps every " + std::to_string(options_.window_every) +
                    "): " + std::to_string(windows_) + " windows, " +
                    std::to_string(window_bytes_total_) + " bytes in all, largest " +
                    std::to_string(window_bytes_max_) + ", " + std::to_string(window_events_) +
                    " events, each complete JSON";
  }
  const std::vector<std::string> lines = GatherStrings(SummaryLine(tally), rank_, size_);
  const int mine = failed_ ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank_ == 0) {
    for (const std::string& l : lines) std::printf("%s\n", l.c_str());
    if (!timeline_line.empty()) std::printf("%s\n", timeline_line.c_str());
    if (!dir.empty()) {
      if (keep_timeline) {
        std::printf("soak timeline kept in %s\n", dir.c_str());
      } else {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    }
    std::printf("soak %s: %lld steps at %d ranks, seed %llu, in %.1f s\n",
                any ? "FAILED" : "PASSED", static_cast<long long>(tally ? tally->steps : 0), size_,
                static_cast<unsigned long long>(options_.seed), seconds);
    std::fflush(stdout);
  }
  return any;
}

Watchdog::Watchdog(double limit_seconds) : limit_(limit_seconds), thread_([this] { Watch(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::Enter(const std::string& phase, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  phase_ = phase;
  step_ = step;
  since_ = std::chrono::steady_clock::now();
}

void Watchdog::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void Watchdog::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::seconds(1));
    if (stop_ || !armed_ || std::chrono::steady_clock::now() - since_ < limit_) continue;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr,
                 "soak rank %d: FAIL HANG: %s (step %lld) has not returned after %.0f s; "
                 "aborting the job\n",
                 rank, phase_.c_str(), static_cast<long long>(step_), limit_.count());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
}

}  // namespace soak
}  // namespace gradsync
