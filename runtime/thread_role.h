// Which of gradsync's threads the calling thread is. The background thread runs completion
// callbacks and output allocators; a blocking API call made from there (waiting on a handle,
// shutdown, join, changing process sets) would wait for that same thread and deadlock, so the
// bindings ask here first and refuse such calls with an error.
//
// Thread safety: each thread reads and writes only its own flag.
#pragma once

#include <sys/prctl.h>

namespace gradsync {

namespace internal {
inline thread_local bool t_on_background_thread = false;
}  // namespace internal

// Called once by each of gradsync's own threads (the background thread, the finalizer) as it
// starts. It also shortens the thread's timer slack to a microsecond: Linux stretches every timed
// sleep by the slack, 50 us by default, and these threads sleep for a few microseconds between
// looks at work that a GPU finishes in about as long.
inline void MarkBackgroundThread() {
  internal::t_on_background_thread = true;
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
}
inline bool OnBackgroundThread() { return internal::t_on_background_thread; }

// A caller's thread while it runs the background loop's cycle (a locked bucket it launches): the
// callbacks that cycle completes run on it, and are held to the same limits.
class BackgroundWorkScope {
 public:
  BackgroundWorkScope() : was_(internal::t_on_background_thread) {
    internal::t_on_background_thread = true;
  }
  ~BackgroundWorkScope() { internal::t_on_background_thread = was_; }
  BackgroundWorkScope(const BackgroundWorkScope&) = delete;
  BackgroundWorkScope& operator=(const BackgroundWorkScope&) = delete;

 private:
  bool was_;
};

}  // namespace gradsync
