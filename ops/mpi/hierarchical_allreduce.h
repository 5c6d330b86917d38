// HierarchicalAllreduce: the allreduce for communicators that span hosts. The ranks of each host
// reduce their data within the host, each rank ending with one slice reduced; the ranks holding the
// same slice on the different hosts allreduce it across hosts; the host's ranks then gather every
// slice. Each byte crosses the network once per host instead of once per rank, and every rank of a
// host sends its share of it at the same time.
//
// Within a host the data goes through node shared memory when the bucket fits it (see
// shared_memory_allreduce.h), else through MPI_Reduce_scatter and MPI_Allgatherv on the host's
// communicator. Both cut the bucket into the same slices (SliceOf), so hosts may take different
// paths for one bucket and still meet in the same allreduce across hosts.
//
// Used only when every rank asked for it and it applies: several hosts, and the same number of
// ranks, more than one, on each.
//
// Thread safety: none; used by the background thread only. Every method but the accessors is
// collective over the communicator and must be called by every rank at the same point.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gradsync/status.h"
#include "ops/mpi/node_shared_memory.h"

namespace gradsync {

// Tests only: with n > 0, the ranks of each communicator are taken as hosts of n consecutive ranks
// instead of the nodes MPI reports, so the hierarchy runs on one machine; 0 restores the nodes.
// Set before the first collective of the planes it is meant for, with no plane in use.
void SetRanksPerHostForTesting(int ranks_per_host);

class HierarchicalAllreduce {
 public:
  // `requested`: this rank's GRADSYNC_HIERARCHICAL_ALLREDUCE. `shm_threshold_bytes` bounds the
  // buckets that go through shared memory within a host (0: none); the ranks use the smallest
  // value of any rank. No MPI call is made until Applies().
  HierarchicalAllreduce(MPI_Comm comm, bool requested, int64_t shm_threshold_bytes);
  ~HierarchicalAllreduce();
  HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
  HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

  // Collective. Sets *applies when every rank requested it and the communicator has several hosts
  // with the same number of ranks, more than one, on each. The first call decides (one small
  // allreduce when no rank asked; the communicators are split only when every rank did), later
  // calls return the decision. Every rank gets the same answer, even when the ranks' settings
  // differ, so a setting missing on one rank cannot leave the others waiting.
  Status Applies(bool* applies);
  // When the choice is left to calibration rather than asked for, a layout where the path cannot
  // apply is not news: it is logged at debug level instead of info and warning.
  void set_quiet(bool quiet) { quiet_ = quiet; }

  // In place over `count` elements of `elem_size` bytes in `buffer`, through MPI on the host's
  // communicator, the allreduce across hosts in pieces of at most `piece_bytes` (see
  // AllreduceInPieces). Unscaled: the caller applies its scales.
  Status AllreduceInPlace(void* buffer, int64_t count, size_t elem_size, MPI_Datatype type,
                          MPI_Op op, int64_t piece_bytes);

  // Valid once Applies() said yes.
  NodeSharedMemory* host_memory() { return host_memory_.get(); }
  MPI_Comm cross_comm() const { return cross_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

 private:
  enum class State { kUndecided, kNo, kYes };

  Status Decide();

  MPI_Comm comm_;
  bool requested_;
  bool quiet_ = false;
  int64_t shm_threshold_bytes_;
  State state_ = State::kUndecided;
  MPI_Comm local_ = MPI_COMM_NULL;  // this host's ranks
  MPI_Comm cross_ = MPI_COMM_NULL;  // the ranks of the same local rank on every host
  int local_rank_ = 0;
  int local_size_ = 1;
  std::unique_ptr<NodeSharedMemory> host_memory_;
};

}  // namespace gradsync
