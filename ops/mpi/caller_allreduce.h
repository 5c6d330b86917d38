// The allreduce that AllreduceBatch's caller runs itself for a bucket on its lane
// (runtime/caller_lanes.h): the bucket's pieces are copied into a staging buffer with one flag
// element after them, reduced by one MPI_Allreduce on the lane's communicator, and copied back. A
// joined rank takes part with its identity and the flag set, and every rank that sees the flag
// hands the bucket back to the negotiated path.
//
// Thread safety: runs on the calling thread; `comm` and `staging` must not be used by another
// thread meanwhile.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

struct LaneReduction {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // kSum or kAverage: the flag is summed with the data
  double prescale = 1.0;
  double postscale = 1.0;
};

// Reduces the `count` pieces in place over `comm`'s ranks, the staging buffer in MPI allreduces of
// at most `mpi_piece_bytes` (AllreduceInPieces; every rank passes the lane's). `flag` is this
// rank's flag; *flagged says whether any rank set its own. An MPI failure comes back as a Status
// naming `what`.
Status AllreduceOnLane(const HostSegment* pieces, size_t count, const LaneReduction& reduction,
                       bool flag, MPI_Comm comm, int64_t mpi_piece_bytes, const std::string& what,
                       std::vector<unsigned char>* staging, bool* flagged);

}  // namespace gradsync
