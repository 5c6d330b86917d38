// The MPI datatype and reduction op for each gradsync dtype and reduce op. float16 and bfloat16
// use gradsync's own MPI ops (created once, on first use), which accumulate in float32. And the
// allreduce of any element count, which MPI's int counts do not take in one call.
//
// Called by the background thread only (MPI op creation is not thread-safe here).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "gradsync/status.h"
#include "gradsync/types.h"

namespace gradsync {

MPI_Datatype MpiDatatypeOf(DataType dtype);
// kAverage maps to the sum op (the data plane folds 1/size into the postscale).
Status MpiReduceOpOf(DataType dtype, ReduceOp op, MPI_Op* out);

// MPI_Allreduce over `count` elements of `elem_size` bytes on `comm`, one piece after another:
// pieces of at most `piece_bytes` (whole elements, at least one; 0: no limit of ours), and never
// more than MPI's int count takes. `send` may be MPI_IN_PLACE. Every rank must pass the same
// count and piece size, which fix the sequence of collectives. Calibration picks the piece size
// where a large allreduce in pieces that stay in the cache beats one through memory
// (docs/architecture.md, "Fusion planning").
Status AllreduceInPieces(const void* send, void* recv, int64_t count, size_t elem_size,
                         MPI_Datatype type, MPI_Op op, MPI_Comm comm, int64_t piece_bytes);

}  // namespace gradsync
