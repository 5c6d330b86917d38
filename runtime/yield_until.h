// YieldUntil: a short poll under a mutex that gives the core away between looks.
//
// For a thread about to sleep on a condition variable whose work usually comes back within
// microseconds: waking a sleeping thread costs about as long again, and the thread that brings the
// work (a caller pushing a burst) may need this very core, so the looks yield (runtime/cpu_relax.h
// says when to pause instead).
//
// Thread safety: `lock` is the caller's, held on entry and on return.
#pragma once

#include <chrono>
#include <mutex>
#include <thread>

namespace gradsync {

// Called with `lock` held and `ready()` false: releases the lock and yields between looks at
// `ready()` (each taken with the lock held) until it holds or `deadline` has passed. Yields at
// least once.
template <typename Ready>
void YieldUntil(std::unique_lock<std::mutex>* lock, std::chrono::steady_clock::time_point deadline,
                Ready ready) {
  do {
    lock->unlock();
    std::this_thread::yield();
    lock->lock();
  } while (!ready() && std::chrono::steady_clock::now() < deadline);
}

}  // namespace gradsync
