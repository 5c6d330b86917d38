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
// Thread safety: none needed.
#pragma once

namespace gradsync {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace gradsync
