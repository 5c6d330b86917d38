// NodeSharedMemory: one POSIX shared-memory segment mapped by every rank of a communicator whose
// ranks all run on one node, so that a collective can exchange data through loads and stores
// instead of messages: each rank writes its own region, a barrier orders the writes, and every rank
// then reads the regions of all ranks directly.
//
// Each rank owns two regions (a double buffer) used by alternate collectives. A rank starts writing
// a region again only two collectives later, after the first barrier of the collective in between,
// which no rank passes before it has finished reading: one barrier per collective is enough.
//
// One result area, as large as a region, follows: collectives that reduce a slice per rank
// (reduce-scatter, then all-gather) write each slice there after their first barrier and read it
// back after their second. A collective's first barrier is passed by no rank before every rank has
// finished reading the previous collective's results, so one area serves every collective.
//
// The segment is unlinked as soon as every rank has mapped it, so nothing is left in /dev/shm if a
// process dies. Unmapping is local: destruction never waits for other ranks.
//
// Thread safety: none; used by the background thread only. Prepare() and Barrier() are collective
// over the communicator and must be called by every rank at the same point, as every data-plane
// collective is.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "gradsync/status.h"

namespace gradsync {

class NodeSharedMemory {
 public:
  // `max_bytes`: the largest region this rank allows (the ranks use the smallest of all ranks'
  // values; 0 turns the path off). `max_ranks`: communicators with more ranks do not use it. No MPI
  // call is made until Prepare().
  NodeSharedMemory(MPI_Comm comm, int64_t max_bytes, int max_ranks);
  ~NodeSharedMemory();
  NodeSharedMemory(const NodeSharedMemory&) = delete;
  NodeSharedMemory& operator=(const NodeSharedMemory&) = delete;

  // Collective. Sets *usable when a collective of `bytes` per rank can go through shared memory,
  // mapping or growing the segment first; every rank gets the same answer. The first call decides
  // whether the path is available at all (one node, at most max_ranks ranks, more than one rank). A
  // segment that cannot be mapped on some rank turns the path off on every rank, with a warning;
  // only a failing MPI call is an error.
  Status Prepare(size_t bytes, bool* usable);
  // Rank `rank`'s region of the current buffer, at least the `bytes` of the last Prepare().
  char* Region(int rank) const;
  // The result area, at least the `bytes` of the last Prepare().
  char* Result() const;
  // Collective: every rank's writes to its region before the call are visible to every rank's
  // reads after it.
  Status Barrier();
  // Moves to the other buffer; call once after each collective that used the regions.
  void Flip() { current_ ^= 1; }

 private:
  enum class State { kUndecided, kOff, kOn };

  Status Decide();
  // Maps a segment with regions of `region_bytes`; on success replaces the current one.
  Status Map(size_t region_bytes);
  void Unmap();

  MPI_Comm comm_;
  int size_ = 1;
  int rank_ = 0;
  int64_t max_bytes_;  // this rank's; the agreed value after Decide()
  int max_ranks_;
  State state_ = State::kUndecided;
  char* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  size_t region_bytes_ = 0;
  int current_ = 0;
};

}  // namespace gradsync
