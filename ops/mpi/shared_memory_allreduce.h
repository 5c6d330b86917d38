// The reduce-scatter then all-gather allreduce through NodeSharedMemory, which serves nodes of any
// number of ranks: each rank reads every region once for its own slice and the result area once,
// so the work per rank stays the size of the bucket however many ranks share the node (folding
// every region on every rank, the path for a few ranks, grows with the rank count). The
// hierarchical allreduce reuses it with an allreduce across hosts between the two halves.
//
// Thread safety: none; called by the background thread only, collectively over the memory's
// communicator.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/element_range.h"
#include "ops/mpi/node_shared_memory.h"

namespace gradsync {

// Part `part` of `count` elements of `elem_size` bytes cut into `parts` nearly equal parts. Inner
// boundaries fall on 64-byte multiples, so no two ranks write one cache line, and the same inputs
// give the same cut on every rank and every host.
ElementRange SliceOf(int64_t count, size_t elem_size, int parts, int part);

struct SliceReduction {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double postscale = 1.0;
  // When set, each rank's reduced slice is allreduced over `cross` (the ranks holding the same
  // slice on the other hosts) before the scale, in pieces of at most `piece_bytes` (see
  // AllreduceInPieces); `mpi_type` and `mpi_op` are used there.
  MPI_Comm cross = MPI_COMM_NULL;
  MPI_Datatype mpi_type = MPI_DATATYPE_NULL;
  MPI_Op mpi_op = MPI_OP_NULL;
  int64_t piece_bytes = 0;
};

// Every rank of the memory's communicator (`rank` of `size`) has packed a bucket of `count`
// elements into its memory->Region(rank). On return, memory->Result() holds the reduced bucket,
// scaled, on every rank; call memory->Flip() once it has been read. Slices are folded in rank
// order, so every rank reads the same bits.
Status ReduceSlicesThroughSharedMemory(NodeSharedMemory* memory, int rank, int size, int64_t count,
                                       const SliceReduction& how);

}  // namespace gradsync
