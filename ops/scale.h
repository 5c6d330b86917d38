// Host kernels shared by the host data planes: scaled copies and the element-wise reductions that
// back the float16/bfloat16 MPI ops.
//
// Thread safety: pure functions over caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gradsync/types.h"

namespace gradsync {

// dst[i] = src[i] * factor for `count` elements of `dtype`, for a factor other than 1 (src may
// equal dst). Integer types multiply in double and truncate toward zero; float16/bfloat16 multiply
// in float32.
void ScaleElements(const void* src, void* dst, int64_t count, DataType dtype, double factor);

// ScaleElements, where a factor of exactly 1 is a plain copy (or nothing, when src == dst). Inline:
// the fused copies call it for every tensor, mostly with factor 1.
inline void ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype, double factor) {
  if (count <= 0) return;
  if (factor != 1.0) return ScaleElements(src, dst, count, dtype, factor);
  if (src != dst) std::memmove(dst, src, static_cast<size_t>(count) * DataTypeSize(dtype));
}

// out[i] = inputs[0][i] (op) inputs[1][i] (op) ... in input order, then scaled by `postscale` as
// ScaledCopy scales; every caller folding the same inputs gets the same bits. Sums and products of
// integers wrap around; min and max of floating types propagate NaN; float16/bfloat16 fold in
// float32 and round once, after the scale. `out` must not overlap an input unless it is
// inputs[0]. Average is a sum here (the caller's postscale divides).
void CombineInto(const void* const* inputs, int num_inputs, void* out, int64_t count,
                 DataType dtype, ReduceOp op, double postscale);

// Fills `count` elements of `dtype` with the identity of `op`, the value that leaves every other
// rank's contribution unchanged: 0 for sum and average, 1 for product, and for min and max the
// type's largest and lowest value (+inf and -inf for floating types).
void FillReductionIdentity(void* dst, int64_t count, DataType dtype, ReduceOp op);

// Fills what a rank without the tensor (a joined rank's stand-in) contributes to an allreduce
// that scales every contribution by `prescale` before reducing: values that, once scaled, change
// no other rank's result. Scaling is monotonic, so for min and max an identity's extreme scales
// to the extreme of every scaled value, the opposite one under a negative factor; a factor of 0
// makes every contribution 0. A product's 1 survives no other factor (negotiation refuses it).
void FillJoinedContribution(void* dst, int64_t count, DataType dtype, ReduceOp op, double prescale);

// inout[i] = inout[i] (op) in[i], for float16/bfloat16 with float32 arithmetic. `op` is sum, min,
// max or product.
void ReduceHalfPrecision(const void* in, void* inout, int64_t count, DataType dtype, ReduceOp op);

}  // namespace gradsync
