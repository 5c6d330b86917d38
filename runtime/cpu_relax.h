// CpuRelax: one short pause inside a busy poll, without giving the core away.
//
// A poll that expects its answer within microseconds (a peer reaching the same locked bucket)
// spins on this rather than on std::this_thread::yield(). When every core is busy (ranks whose
// compute fills the host), a yield lets the thread that shares the core run on, and the poll may
// look again only after that thread's time slice: on a 2-core VM running two ranks' compute
// (Linux 6.18), a locked bucket's exchange polled between yields waited about a millisecond for
// its peer, and polled with pauses it waited microseconds (docs/benchmarks.md). Where a core is
// free, both look again at once. A poll that waits for a thread which may need this very core
// (one that pushes a burst of work) yields instead; a wait that can last long sleeps.
//
// LockSpinningFirst takes a mutex whose holders keep it for a microsecond or so by trying it
// between pauses before it blocks: a thread that blocks on a mutex sleeps in the kernel, and its
// wake-up costs many times the wait it avoided, more when another thread has taken its core
// meanwhile.
//
// Thread safety: none needed.
#pragma once

#include <chrono>
#include <mutex>

namespace gradsync {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Takes `lock`'s mutex (the lock made with std::defer_lock): tries it between pauses for up to
// `spin`, then blocks. The clock is read every few tries only; a try is a write to the mutex's
// cache line, so pauses come between them.
template <typename Mutex>
void LockSpinningFirst(std::unique_lock<Mutex>* lock, std::chrono::nanoseconds spin) {
  if (lock->try_lock()) return;
  const auto until = std::chrono::steady_clock::now() + spin;
  for (int tries = 1;; ++tries) {
    for (int pauses = 0; pauses < 8; ++pauses) CpuRelax();
    if (lock->try_lock()) return;
    if (tries % 8 == 0 && std::chrono::steady_clock::now() >= until) break;
  }
  lock->lock();
}

}  // namespace gradsync
