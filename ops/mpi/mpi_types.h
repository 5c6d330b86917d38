// The MPI datatype and reduction op for each gradsync dtype and reduce op. float16 and bfloat16
// use gradsync's own MPI ops (created once, on first use), which accumulate in float32. And the
// allreduce of any element count, which MPI's int counts do not take in one call.
//
// Called by the background thread only (MPI op creation is not thread-safe here).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "gradsync/status.h"
#include "gradsync/types.h"

namespace gradsync {

MPI_Datatype MpiDatatypeOf(DataType dtype);
// kAverage maps to the sum op (the data plane folds 1/size into the postscale).
Status MpiReduceOpOf(DataType dtype, ReduceOp op, MPI_Op* out);

// Work on each piece of AllreduceInPieces, on its bytes [begin, end) of `recv`, right before and
// right after its allreduce while the piece is still in the cache: packing it, scaling it,
// copying it out. The same work as passes of their own over a range larger than the cache goes
// through memory, and added a fifth to two thirds to the allreduce's time between two hosts
// (docs/benchmarks.md, "Work on each piece").
struct PieceHooks {
  std::function<void(size_t begin, size_t end)> before;
  std::function<void(size_t begin, size_t end)> after;
};

// Hooks that scale each piece by `prescale` on its way in from `in` (which may be `out`) to
// `out`, and by `postscale` on its way out; a factor of one gets no hook, except on the way in
// when `in` is not `out` (the piece is copied, so that the reduction is in place on every rank).
PieceHooks ScalingHooks(const void* in, void* out, DataType dtype, double prescale,
                        double postscale);

// MPI_Allreduce over `count` elements of `elem_size` bytes on `comm`, one piece after another:
// pieces of at most `piece_bytes` (whole elements, at least one; 0: no limit of ours), and never
// more than MPI's int count takes. `send` may be MPI_IN_PLACE, and must be where `hooks` has a
// `before` (the hook fills the piece, which is then reduced in place). Every rank must pass the
// same count and piece size, which fix the sequence of collectives. Calibration picks the piece
// size where a large allreduce in pieces that stay in the cache beats one through memory
// (docs/architecture.md, "Fusion planning").
Status AllreduceInPieces(const void* send, void* recv, int64_t count, size_t elem_size,
                         MPI_Datatype type, MPI_Op op, MPI_Comm comm, int64_t piece_bytes,
                         const PieceHooks& hooks = PieceHooks{});

}  // namespace gradsync
