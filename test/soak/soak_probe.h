// What the soak watches besides results: the process's resident memory, open file descriptors,
// threads and memory mappings (leaked communicators, shared-memory segments or threads show up
// there even though gradsync's pools are not observable from outside), and the timeline file,
// checked as a stream so that a file of hundreds of megabytes costs no memory.
//
// Thread safety: pure functions of the process's /proc entries and the file; call from any thread.
#pragma once

#include <cstdint>
#include <string>

namespace gradsync {
namespace soak {

struct ProcessSample {
  int64_t step = 0;
  int64_t rss_kib = 0;  // resident set, from /proc/self/statm
  // Its parts from /proc/self/status: private anonymous pages (heap, stacks, private mappings),
  // and shared-memory pages (gradsync's and MPI's shared-memory transports).
  int64_t anon_kib = 0;
  int64_t shmem_kib = 0;
  int64_t fds = 0;      // entries in /proc/self/fd
  int64_t threads = 0;  // Threads: in /proc/self/status
  int64_t maps = 0;     // lines of /proc/self/maps
  // Bytes malloc has handed out and not had back (mallinfo2: every arena, and mmapped chunks).
  // Unlike the resident set, this does not move with fragmentation or freed pages kept by
  // malloc, so steady growth here is a leak.
  int64_t heap_kib = 0;
  // The part of both that stands in for device memory (the host device backend's allocations,
  // with --device-tensors), which a GPU would hold instead: left out of the bounds.
  int64_t device_kib = 0;
  // A timeline window was being written: its writer thread and file are open.
  bool timeline_open = false;
};

ProcessSample SampleProcess(int64_t step);

struct TimelineReport {
  bool ok = false;
  std::string why;  // what is wrong when !ok
  int64_t bytes = 0;
  int64_t events = 0;  // objects in the traceEvents array
  int64_t cycles = 0;  // CYCLE_START markers
  int64_t locks = 0;   // LOCK and UNLOCK marks: the locked schedule's
  int64_t unlocks = 0;
  int64_t locked_tensors = 0;  // tensors that waited for a locked bucket (LOCKED_ phases)
  bool dropped = false;        // the writer recorded TIMELINE_DROPPED_EVENTS
};

// Checks that `path` holds one complete JSON object (strings terminated, escapes well formed,
// brackets balanced and closed, nothing after the end) with a non-empty "traceEvents" array.
TimelineReport CheckTimeline(const std::string& path);

}  // namespace soak
}  // namespace gradsync
