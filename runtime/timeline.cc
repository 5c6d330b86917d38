#include "runtime/timeline.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <system_error>
#include <utility>

#include "runtime/logging.h"

namespace gradsync {
namespace {

// Long enough that an idle timeline costs nothing, short enough that a trace being watched, or a
// process that dies, loses little.
constexpr std::chrono::milliseconds kWriterPeriod(100);
// Records that wake the writer early; a burst then never waits a whole period in memory.
constexpr size_t kWakeWriterAt = 16384;
// Formatted bytes the writer holds before handing them to the file.
constexpr size_t kWriteChunkBytes = size_t{1} << 20;

// Row 0 carries no tensor: the process name and the global cycle markers.
constexpr const char* kHeader =
    "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"gradsync\"}}";
constexpr const char* kFooter = "\n]}\n";

void AppendInt(int64_t value, std::string* out) {
  char buf[24];
  auto result = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, result.ptr);
}

// Length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 if there is none.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  auto byte = [s](size_t k) -> unsigned {
    return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u;  // 0 is never a continuation
  };
  const unsigned lead = byte(i);
  size_t length = 0;
  unsigned low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  const unsigned second = byte(i + 1);
  if (second < low || second > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    const unsigned next = byte(i + k);
    if (next < 0x80 || next > 0xBF) return 0;
  }
  return length;
}

// Tensor names come from users and may hold any bytes. Viewers reject a file with one bad string,
// so invalid UTF-8 becomes U+FFFD rather than passing through.
void AppendJsonString(std::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
      ++i;
    } else if (c < 0x20) {
      out->append("\\u00");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xF]);
      ++i;
    } else if (c < 0x80) {
      out->push_back(static_cast<char>(c));
      ++i;
    } else if (size_t length = Utf8SequenceLength(s, i); length != 0) {
      out->append(s.substr(i, length));
      i += length;
    } else {
      out->append("\\ufffd");
      ++i;
    }
  }
  out->push_back('"');
}

// `"ts":T,"pid":0,"tid":R` — every event but metadata has it.
void AppendPlacement(int64_t ts_us, int32_t row, std::string* out) {
  out->append("\"ts\":");
  AppendInt(ts_us, out);
  out->append(",\"pid\":0,\"tid\":");
  AppendInt(row, out);
}

}  // namespace

Timeline::Timeline(size_t max_pending_events)
    : max_pending_events_(std::max<size_t>(2, max_pending_events)),
      wake_writer_at_(std::max<size_t>(1, std::min(kWakeWriterAt, max_pending_events_ / 2))) {}

Timeline::~Timeline() { Stop(); }

Status Timeline::Start(const std::string& path) {
  std::lock_guard<std::mutex> control(control_mu_);
  if (writer_.joinable()) {
    return Status::InvalidArgument("timeline: cannot start writing '" + path +
                                   "': already writing '" + path_ + "'; stop it first");
  }
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    const int error = errno;
    return Status::InvalidArgument("timeline: cannot open '" + path +
                                   "' for writing: " + std::generic_category().message(error));
  }
  file_ = file;
  path_ = path;
  write_status_ = Status::OK();
  Write(kHeader);
  Flush();
  if (!write_status_.ok()) {
    std::fclose(file_);
    file_ = nullptr;
    return write_status_;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.clear();
    rows_.clear();
    rows_named_ = 0;
    dropped_ = 0;
    wake_requested_ = false;
    stopping_ = false;
    start_time_ = std::chrono::steady_clock::now();
    active_.store(true, std::memory_order_relaxed);
  }
  writer_ = std::thread(&Timeline::WriterLoop, this);
  return Status::OK();
}

Status Timeline::Stop() {
  std::lock_guard<std::mutex> control(control_mu_);
  if (!writer_.joinable()) return Status::OK();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Phases still open end here, so that every begin written has its end.
    const int64_t now_us = NowLocked();
    for (auto& [name, row] : rows_) {
      for (auto open = row.open.rbegin(); open != row.open.rend(); ++open) {
        if (*open) pending_.push_back(Event{Event::Kind::kEnd, row.id, 0, now_us, {}});
      }
      row.open.clear();
    }
    active_.store(false, std::memory_order_relaxed);
    stopping_ = true;
  }
  cv_.notify_one();
  writer_.join();
  if (std::fclose(file_) != 0) SetWriteError("closing", errno);
  file_ = nullptr;
  return std::exchange(write_status_, Status::OK());
}

void Timeline::NegotiateStart(const std::string& name, std::string_view op_label) {
  Record(Event::Kind::kNegotiateBegin, &name, op_label, 0);
}

void Timeline::RankReady(const std::string& name, int rank) {
  Record(Event::Kind::kRankReady, &name, {}, rank);
}

void Timeline::NegotiateEnd(const std::string& name) { Record(Event::Kind::kEnd, &name, {}, 0); }

void Timeline::ActivityStart(const std::string& name, std::string_view activity) {
  Record(Event::Kind::kBegin, &name, activity, 0);
}

void Timeline::ActivityEnd(const std::string& name) { Record(Event::Kind::kEnd, &name, {}, 0); }

void Timeline::ActivitySpan(const std::string& name, std::string_view activity,
                            std::chrono::steady_clock::time_point begin,
                            std::chrono::steady_clock::time_point end) {
  const std::chrono::steady_clock::time_point span[2] = {begin, std::max(begin, end)};
  Record(Event::Kind::kSpan, &name, activity, 0, span);
}

void Timeline::CycleMark() { Record(Event::Kind::kCycle, nullptr, {}, 0); }

void Timeline::Mark(std::string_view text) { Record(Event::Kind::kMark, nullptr, text, 0); }

int64_t Timeline::NowLocked() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start_time_)
      .count();
}

// The clock is read under the lock so that the buffer, and hence the file, is in time order even
// when several threads record (spans excepted: they are recorded once they have ended). Room for
// two records is checked first so that a tensor's row is never created without its name.
void Timeline::Record(Event::Kind kind, const std::string* name, std::string_view text, int rank,
                      const std::chrono::steady_clock::time_point* span) {
  if (!active()) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_.load(std::memory_order_relaxed)) return;  // Stop won the race
    Row* row = name != nullptr ? &rows_[*name] : nullptr;
    const bool opens = kind == Event::Kind::kBegin || kind == Event::Kind::kNegotiateBegin;
    const bool room = pending_.size() + 2 <= max_pending_events_;
    if (kind == Event::Kind::kEnd && row != nullptr && !row->open.empty()) {
      // The end of a dropped begin goes too; that of a written one is kept past the bound (the
      // open begins bound how far), so that the row's phases nest as they ran.
      const bool begin_written = row->open.back();
      row->open.pop_back();
      if (!begin_written) {
        ++dropped_;
        return;
      }
    } else if (kind == Event::Kind::kEnd) {
      return;  // its begin came before Start: an end alone would not pair in the file
    } else if (!room) {
      ++dropped_;
      if (opens && row != nullptr) row->open.push_back(false);
      return;
    }
    if (opens && row != nullptr) row->open.push_back(true);
    const int64_t ts_us = NowLocked();
    int32_t row_id = 0;
    if (row != nullptr) {
      if (row->id == 0) {
        row->id = ++rows_named_;
        pending_.push_back(Event{Event::Kind::kRowName, row->id, 0, ts_us, *name});
      }
      row_id = row->id;
    }
    Event event{kind, row_id, rank, ts_us, std::string(text)};
    if (span != nullptr) {
      // A span from before Start begins with the file.
      auto since_start = [this](std::chrono::steady_clock::time_point t) {
        return std::max<int64_t>(
            0, std::chrono::duration_cast<std::chrono::microseconds>(t - start_time_).count());
      };
      event.ts_us = since_start(span[0]);
      event.dur_us = since_start(span[1]) - event.ts_us;
    }
    pending_.push_back(std::move(event));
    if (pending_.size() >= wake_writer_at_ && !wake_requested_) {
      wake_requested_ = wake = true;
    }
  }
  if (wake) cv_.notify_one();
}

// Formats outside the lock: the recording thread waits at most for a vector swap.
void Timeline::WriterLoop() {
  std::vector<Event> batch;
  std::string out;
  for (;;) {
    bool last = false;
    uint64_t dropped = 0;
    int64_t end_ts_us = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kWriterPeriod, [this] { return stopping_ || wake_requested_; });
      batch.swap(pending_);  // hands the emptied vector, capacity kept, back to the recorders
      wake_requested_ = false;
      last = stopping_;
      if (last) {
        dropped = dropped_;
        end_ts_us = NowLocked();
      }
    }
    for (const Event& event : batch) {
      AppendEventJson(event, &out);
      if (out.size() >= kWriteChunkBytes) {
        Write(out);
        out.clear();
      }
    }
    batch.clear();
    if (last && dropped != 0) {
      out.append(",\n{\"name\":\"TIMELINE_DROPPED_EVENTS\",\"ph\":\"i\",\"s\":\"g\",");
      AppendPlacement(end_ts_us, 0, &out);
      out.append(",\"args\":{\"dropped_events\":");
      AppendInt(static_cast<int64_t>(dropped), &out);
      out.append("}}");
      Log().warn("timeline '{}': dropped {} events; the writer could not keep up", path_, dropped);
    }
    if (last) out.append(kFooter);
    Write(out);
    out.clear();
    Flush();
    if (last) return;
  }
}

void Timeline::AppendEventJson(const Event& event, std::string* out) {
  out->append(",\n{");
  switch (event.kind) {
    case Event::Kind::kRowName:
      // The sort index keeps rows in first-seen order instead of the viewer's alphabetical one.
      out->append("\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":");
      AppendInt(event.row, out);
      out->append(",\"args\":{\"name\":");
      AppendJsonString(event.text, out);
      out->append("}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":");
      AppendInt(event.row, out);
      out->append(",\"args\":{\"sort_index\":");
      AppendInt(event.row, out);
      out->append("}}");
      return;
    case Event::Kind::kNegotiateBegin:
      out->append("\"name\":");
      AppendJsonString("NEGOTIATE_" + event.text, out);
      out->append(",\"ph\":\"B\",");
      AppendPlacement(event.ts_us, event.row, out);
      break;
    case Event::Kind::kBegin:
      out->append("\"name\":");
      AppendJsonString(event.text, out);
      out->append(",\"ph\":\"B\",");
      AppendPlacement(event.ts_us, event.row, out);
      break;
    case Event::Kind::kEnd:
      // An "E" closes the row's innermost open "B"; it needs no name.
      out->append("\"ph\":\"E\",");
      AppendPlacement(event.ts_us, event.row, out);
      break;
    case Event::Kind::kRankReady:
      out->append("\"name\":\"RANK_READY\",\"ph\":\"i\",\"s\":\"t\",");
      AppendPlacement(event.ts_us, event.row, out);
      out->append(",\"args\":{\"rank\":");
      AppendInt(event.rank, out);
      out->push_back('}');
      break;
    case Event::Kind::kCycle:
      out->append("\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"g\",");
      AppendPlacement(event.ts_us, 0, out);
      break;
    case Event::Kind::kMark:
      out->append("\"name\":");
      AppendJsonString(event.text, out);
      out->append(",\"ph\":\"i\",\"s\":\"g\",");
      AppendPlacement(event.ts_us, 0, out);
      break;
    case Event::Kind::kSpan:
      out->append("\"name\":");
      AppendJsonString(event.text, out);
      out->append(",\"ph\":\"X\",");
      AppendPlacement(event.ts_us, event.row, out);
      out->append(",\"dur\":");
      AppendInt(event.dur_us, out);
      break;
  }
  out->push_back('}');
}

void Timeline::Write(const std::string& data) {
  if (!write_status_.ok() || data.empty()) return;
  if (std::fwrite(data.data(), 1, data.size(), file_) != data.size()) {
    SetWriteError("writing", errno);
  }
}

void Timeline::Flush() {
  if (write_status_.ok() && std::fflush(file_) != 0) SetWriteError("writing", errno);
}

// A timeline is a diagnostic: a full disk must not stop training, so the writer keeps draining
// (memory stays bounded), stops writing, says so once, and Stop returns the error.
void Timeline::SetWriteError(const char* what, int error) {
  if (!write_status_.ok()) return;
  write_status_ = Status::Internal("timeline: " + std::string(what) + " '" + path_ +
                                   "' failed: " + std::generic_category().message(error));
  Log().warn("{}; the trace file is incomplete", write_status_.message());
}

}  // namespace gradsync
