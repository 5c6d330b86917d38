// The soak's bookkeeping and output: progress and memory samples (gathered on rank 0 and printed
// as the run goes), timeline windows, the memory-growth verdict, one summary line per rank, and
// the collective pass/fail. Also the watchdog that turns a blocking call that never returns into
// an aborted job with a message, instead of a silent hang.
//
// Thread safety: a Report is used by the main thread only; its collective members (Sample,
// Finish) must be called at the same points on every rank. The Watchdog's own thread only reads
// what Enter and Leave set, under its mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test/soak/soak_options.h"
#include "test/soak/soak_probe.h"
#include "test/soak/soak_run.h"

namespace gradsync {
namespace soak {

class Report {
 public:
  Report(int rank, int size, const Options& options);
  // Records a failure on this rank and prints it.
  void Fail(const std::string& why);
  bool failed() const { return failed_; }
  // Collective: samples this process, gathers every rank's sample on rank 0, prints progress.
  void Sample(int64_t step, const Tally* tally = nullptr);
  // Timeline windows (rank 0 writes; the calls do nothing elsewhere).
  void StartWindow(const std::string& dir, int64_t step);
  void StopWindow();
  // Collective: checks the whole-run timeline (if any) and the memory samples, prints the summary
  // and returns the exit status every rank agrees on (0: passed).
  int Finish(const Tally* tally, const std::string& timeline_file, const std::string& dir,
             bool keep_timeline);

 private:
  void CheckGrowth();
  std::string SummaryLine(const Tally* tally) const;

  int rank_;
  int size_;
  Options options_;
  bool failed_ = false;
  std::chrono::steady_clock::time_point start_;
  std::vector<ProcessSample> mine_;
  ProcessSample growth_;                         // the largest growth over the baseline, per field
  int64_t growth_base_ = -1;                     // the baseline's step; -1 before CheckGrowth
  std::vector<std::vector<ProcessSample>> all_;  // rank 0: per sample, every rank's
  std::string window_path_;
  int64_t window_step_ = -1;
  bool window_open_ = false;
  int64_t windows_ = 0, window_bytes_max_ = 0, window_bytes_total_ = 0, window_events_ = 0;
};

class Watchdog {
 public:
  explicit Watchdog(double limit_seconds);
  ~Watchdog();
  // The main thread is now in `phase` of `step`; the clock restarts.
  void Enter(const std::string& phase, int64_t step);
  void Leave();

 private:
  void Watch();

  std::chrono::duration<double> limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool armed_ = false;
  std::string phase_;
  int64_t step_ = 0;
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

}  // namespace soak
}  // namespace gradsync
