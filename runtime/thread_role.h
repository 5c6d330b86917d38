// Which of gradsync's threads the calling thread is. The background thread runs completion
// callbacks and output allocators; a blocking API call made from there (waiting on a handle,
// shutdown, join, changing process sets) would wait for that same thread and deadlock, so the
// bindings ask here first and refuse such calls with an error.
//
// Thread safety: each thread reads and writes only its own flag.
#pragma once

namespace gradsync {

namespace internal {
inline thread_local bool t_on_background_thread = false;
}  // namespace internal

// Called once by the background thread before its first cycle.
inline void MarkBackgroundThread() { internal::t_on_background_thread = true; }
inline bool OnBackgroundThread() { return internal::t_on_background_thread; }

}  // namespace gradsync
