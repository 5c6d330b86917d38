// Timeline: records per-tensor activity (negotiation, ranks becoming ready, queueing, copies,
// collectives) as a Chrome trace / Perfetto JSON file ("Trace Event Format", object form), so a
// user can see where a training step spends its time. gradsync writes it on rank 0 only; that is
// the caller's decision, this class just writes.
//
// Each tensor name gets its own row (a "thread" of process 0 in the viewer), named by a metadata
// event the first time the name appears. Negotiation and activities are "B"/"E" duration events
// on that row, a rank becoming ready is an instant event on it, and the start of a background
// cycle is a global instant event. Timestamps are microseconds of the steady clock since Start.
//
// Recording calls only append a small record to an in-memory buffer under a mutex; a writer
// thread owned by this class formats the records and writes them to the file every 100 ms, or
// sooner when the buffer fills, so the recording thread never does file I/O. Memory stays
// bounded: once `max_pending_events` records wait for the writer (the disk cannot keep up),
// further records are dropped (ends of open begins aside, which those begins bound), counted, and
// the count is written at the end of the file. A begin dropped takes its end with it, and an end
// whose begin was written is never dropped, so every row's begins and ends stay balanced.
//
// Thread safety: recording calls and active() may be called from any thread, concurrently with
// each other and with Start/Stop; a record made while the timeline is not active, or that races
// with Stop, may be discarded but never corrupts the file. Start and Stop may be called from any
// thread too (the public start_timeline and stop_timeline are); they take turns. Phases open at
// Stop end there, and an end whose begin came before Start is left out, so every row's begins and
// ends pair in the file.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

class Timeline {
 public:
  static constexpr size_t kDefaultMaxPendingEvents = size_t{1} << 20;

  // `max_pending_events` (at least 2) bounds the records held between two writer passes.
  explicit Timeline(size_t max_pending_events = kDefaultMaxPendingEvents);
  ~Timeline();  // Calls Stop().

  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Creates or truncates `path`, writes the header and starts the writer thread; the clock and
  // the tensor rows start afresh. Fails with InvalidArgument naming the path and the OS error if
  // the file cannot be opened, or if the timeline is already started (Stop first: a second file
  // must not silently replace the first). Status has no I/O code, so a failed write, here or
  // later, is reported as Internal.
  Status Start(const std::string& path);
  // Writes every record made so far, closes the JSON so the file is valid, closes the file and
  // joins the writer. Returns the first write error of this run, if any. Idempotent: without a
  // running Start it does nothing and returns OK. Start may be called again afterwards.
  Status Stop();

  // Whether records are being kept; callers check it to skip building labels when off.
  bool active() const { return active_.load(std::memory_order_relaxed); }

  // Negotiation of `name` for an operation such as "ALLREDUCE" (the row shows "NEGOTIATE_<op>").
  void NegotiateStart(const std::string& name, std::string_view op_label);
  // `rank` has reported `name` ready; an instant event on the tensor's row.
  void RankReady(const std::string& name, int rank);
  void NegotiateEnd(const std::string& name);
  // A phase of `name`'s operation, such as "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE".
  void ActivityStart(const std::string& name, std::string_view activity);
  void ActivityEnd(const std::string& name);
  // A phase of `name`'s operation that ran from `begin` to `end` (steady clock), recorded once it
  // is known: a device's copies and collective, timed by its stream's events. A "X" event.
  void ActivitySpan(const std::string& name, std::string_view activity,
                    std::chrono::steady_clock::time_point begin,
                    std::chrono::steady_clock::time_point end);
  // The background thread starts a cycle; a global instant event across all rows.
  void CycleMark();
  // A global instant event named `text`, such as a process set locking its schedule.
  void Mark(std::string_view text);

 private:
  // One recorded event, before formatting; the writer thread turns it into JSON.
  struct Event {
    enum class Kind : uint8_t {
      kRowName,
      kNegotiateBegin,
      kBegin,
      kEnd,
      kRankReady,
      kCycle,
      kSpan,
      kMark
    };
    Kind kind;
    int32_t row;         // the tensor's row; 0 for kCycle
    int32_t rank;        // kRankReady only
    int64_t ts_us;       // microseconds since Start
    std::string text;    // kRowName: the tensor name; kNegotiateBegin: the op; kBegin: the activity
    int64_t dur_us = 0;  // kSpan only
  };

  // `span`, for kSpan: the activity's begin and end, in place of now.
  void Record(Event::Kind kind, const std::string* name, std::string_view text, int rank,
              const std::chrono::steady_clock::time_point* span = nullptr);
  int64_t NowLocked() const;
  void WriterLoop();
  static void AppendEventJson(const Event& event, std::string* out);
  // Append to, and flush, the file unless an earlier write failed. Writer thread (or Start) only.
  void Write(const std::string& data);
  void Flush();
  void SetWriteError(const char* what, int error);

  const size_t max_pending_events_;
  const size_t wake_writer_at_;  // pending records that wake the writer before its period ends

  std::atomic<bool> active_{false};  // written only under mu_, read anywhere

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> pending_;  // guarded by mu_
  // A tensor's row: its id in the file (0 until a record of it is written) and, for each of its
  // phases still open, innermost last, whether its begin was written.
  struct Row {
    int32_t id = 0;
    std::vector<bool> open;
  };
  std::unordered_map<std::string, Row> rows_;         // guarded by mu_; cleared by Start
  int32_t rows_named_ = 0;                            // guarded by mu_
  std::chrono::steady_clock::time_point start_time_;  // guarded by mu_
  uint64_t dropped_ = 0;                              // guarded by mu_
  bool wake_requested_ = false;                       // guarded by mu_
  bool stopping_ = false;                             // guarded by mu_

  std::mutex control_mu_;  // held by Start and Stop throughout: they take turns
  std::thread writer_;     // guarded by control_mu_
  // The writer thread's while it runs, guarded by control_mu_ otherwise.
  std::FILE* file_ = nullptr;
  std::string path_;
  Status write_status_;
};

}  // namespace gradsync
