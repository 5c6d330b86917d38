// Process samples and the timeline check; see soak_probe.h.
#include "test/soak/soak_probe.h"

#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ops/device/host_device_backend.h"

namespace gradsync {
namespace soak {
namespace {

int64_t CountLines(const char* path) {
  std::ifstream in(path);
  int64_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

int64_t CountEntries(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  int64_t entries = 0;
  while (const dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++entries;
  }
  closedir(d);
  return entries - 1;  // the descriptor opendir itself holds
}

int64_t StatusField(const char* field) {
  std::ifstream in("/proc/self/status");
  const size_t length = std::strlen(field);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, length, field) == 0) return std::stoll(line.substr(length));
  }
  return -1;
}

// A streaming JSON syntax check: a container stack, string and escape states, and the characters
// allowed between tokens. Enough to tell a complete, viewer-readable trace from a truncated or
// corrupted one without holding the file in memory.
class JsonStream {
 public:
  void Feed(const char* data, size_t size) {
    for (size_t i = 0; i < size && why_.empty(); ++i) Step(static_cast<unsigned char>(data[i]));
  }
  std::string Finish() {
    if (!why_.empty()) return why_;
    if (!started_) return "the file is empty";
    if (in_string_) return "the file ends inside a string";
    if (!stack_.empty())
      return "the file ends with " + std::to_string(stack_.size()) + " open brackets";
    return "";
  }
  int64_t events() const { return events_; }
  int64_t cycles() const { return cycles_; }
  int64_t locks() const { return locks_; }
  int64_t unlocks() const { return unlocks_; }
  int64_t locked_tensors() const { return locked_tensors_; }
  bool dropped() const { return dropped_; }

 private:
  void Fail(const std::string& what) { why_ = what + " at byte " + std::to_string(offset_); }

  void Step(unsigned char c) {
    ++offset_;
    if (in_string_) return StringStep(c);
    if (std::isspace(c)) return;
    if (closed_) return Fail("content after the end of the document");
    if (!started_ && c != '{') return Fail("the document does not start with '{'");
    started_ = true;
    switch (c) {
      case '{':
      case '[':
        // Objects directly inside the root object's array are the trace events.
        if (c == '{' && stack_.size() == 2 && stack_[1] == '[') ++events_;
        stack_.push_back(static_cast<char>(c));
        return;
      case '}':
      case ']':
        if (stack_.empty() || stack_.back() != (c == '}' ? '{' : '[')) {
          return Fail(std::string("unmatched '") + static_cast<char>(c) + "'");
        }
        stack_.pop_back();
        closed_ = stack_.empty();
        return;
      case '"':
        in_string_ = true;
        text_.clear();
        return;
      default:
        if (std::strchr(",:-+.eEtrufalsn0123456789", c) == nullptr) {
          return Fail("unexpected character " + std::to_string(c));
        }
    }
  }

  void StringStep(unsigned char c) {
    if (hex_left_ > 0) {
      if (!std::isxdigit(c)) return Fail("bad \\u escape");
      --hex_left_;
    } else if (escaped_) {
      escaped_ = false;
      if (c == 'u') {
        hex_left_ = 4;
      } else if (std::strchr("\"\\/bfnrt", c) == nullptr) {
        return Fail("bad escape");
      }
    } else if (c == '\\') {
      escaped_ = true;
    } else if (c == '"') {
      in_string_ = false;
      if (text_ == "CYCLE_START") ++cycles_;
      if (text_.compare(0, 9, "LOCK set ") == 0) ++locks_;
      if (text_.compare(0, 11, "UNLOCK set ") == 0) ++unlocks_;
      if (text_.compare(0, 7, "LOCKED_") == 0) ++locked_tensors_;
      if (text_ == "TIMELINE_DROPPED_EVENTS") dropped_ = true;
      return;
    } else if (c < 0x20) {
      return Fail("control character in a string");
    }
    if (text_.size() < 32) text_ += static_cast<char>(c);
  }

  std::vector<char> stack_;
  bool started_ = false, closed_ = false, in_string_ = false, escaped_ = false;
  int hex_left_ = 0;
  std::string text_;  // the start of the current string
  int64_t offset_ = 0, events_ = 0, cycles_ = 0, locks_ = 0, unlocks_ = 0, locked_tensors_ = 0;
  bool dropped_ = false;
  std::string why_;
};

}  // namespace

ProcessSample SampleProcess(int64_t step) {
  ProcessSample s;
  s.step = step;
  long pages_total = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = -1;
    std::fclose(f);
  }
  s.rss_kib = static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE) / 1024;
  s.fds = CountEntries("/proc/self/fd");
  s.threads = StatusField("Threads:");
  s.anon_kib = StatusField("RssAnon:");
  s.shmem_kib = StatusField("RssShmem:");
  s.maps = CountLines("/proc/self/maps");
  const struct mallinfo2 heap = mallinfo2();
  s.heap_kib = static_cast<int64_t>((heap.uordblks + heap.hblkhd) / 1024);
  s.device_kib = HostDeviceBackend::DeviceBytesHeld() / 1024;
  return s;
}

TimelineReport CheckTimeline(const std::string& path) {
  TimelineReport report;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    report.why = "cannot open " + path;
    return report;
  }
  JsonStream json;
  std::vector<char> chunk(1 << 20);
  for (size_t got; (got = std::fread(chunk.data(), 1, chunk.size(), f)) > 0;) {
    json.Feed(chunk.data(), got);
    report.bytes += static_cast<int64_t>(got);
  }
  std::fclose(f);
  report.why = json.Finish();
  report.events = json.events();
  report.cycles = json.cycles();
  report.locks = json.locks();
  report.unlocks = json.unlocks();
  report.locked_tensors = json.locked_tensors();
  report.dropped = json.dropped();
  if (report.why.empty() && report.events == 0) report.why = "no trace events";
  report.ok = report.why.empty();
  return report;
}

}  // namespace soak
}  // namespace gradsync
