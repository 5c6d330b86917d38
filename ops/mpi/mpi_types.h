// The MPI datatype and reduction op for each gradsync dtype and reduce op. float16 and bfloat16
// use gradsync's own MPI ops (created once, on first use), which accumulate in float32.
//
// Called by the background thread only (MPI op creation is not thread-safe here).
#pragma once

#include <mpi.h>

#include "gradsync/status.h"
#include "gradsync/types.h"

namespace gradsync {

MPI_Datatype MpiDatatypeOf(DataType dtype);
// kAverage maps to the sum op (the data plane folds 1/size into the postscale).
Status MpiReduceOpOf(DataType dtype, ReduceOp op, MPI_Op* out);

}  // namespace gradsync
