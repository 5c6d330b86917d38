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

// MPI_Allreduce over `count` elements of `elem_size` bytes on `comm`, in pieces that fit MPI's int
// count. `send` may be MPI_IN_PLACE.
Status AllreduceInPieces(const void* send, void* recv, int64_t count, size_t elem_size,
                         MPI_Datatype type, MPI_Op op, MPI_Comm comm);

}  // namespace gradsync
