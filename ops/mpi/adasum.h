// Adasum, the adaptive summation of Maleki et al. ("Scaling Distributed Training with Adaptive
// Summation", MLSys 2021) that Horovod offers as op=Adasum: two ranks' gradients g1 and g2 of one
// tensor combine into
//
//   (1 - g1.g2 / (2 |g1|^2)) g1 + (1 - g1.g2 / (2 |g2|^2)) g2,
//
// their sum where they are orthogonal, either one where they are equal, and in between as their
// directions agree. Ranks combine pairwise up a binary tree: at level d each rank's subtree of d
// ranks meets the one whose ranks differ in bit d. So the result depends on the tensor, not on a
// bucket it was fused into, and the process set must have a power-of-two size.
//
// The data moves as in a recursive-halving reduce-scatter and recursive-doubling allgather: at each
// level a rank keeps half of its span and trades the other half with its partner, so that the two
// subtrees' vectors meet in slices spread over the 2d ranks of the level's group, which sum their
// slices' dot products and norms by recursive doubling before each combines its slice. Each rank
// sends about twice its data in all, as a ring allreduce does, in 2 log2(size) steps, besides the
// small exchanges of dot products (log2(2 level) at each level).
//
// Thread safety: called by the background thread only, with a communicator no other thread uses.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/element_range.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

// Replaces `count` elements at `data` (float or double), the packed tensors `tensors` (ascending,
// disjoint, within [0, count)), by their Adasum over every rank of `comm`, whose size must be a
// power of two. Every rank passes the same `count` and `tensors` and gets the same result, bit for
// bit. `scratch` is working memory it resizes.
template <typename T>
Status AdasumInPlace(T* data, int64_t count, const std::vector<ElementRange>& tensors,
                     MPI_Comm comm, std::vector<T>* scratch);

// AdasumBuffer's working memory, kept between calls: the partner's halves, and half precision
// widened to float32.
struct AdasumScratch {
  std::vector<float> floats;
  std::vector<double> doubles;
  std::vector<float> wide;
};

// Where each of `entries`' inputs lies in its Adasum bucket: back to back with no gap, as every
// Adasum bucket is packed (the MPI plane's and the device plane's alike, so that both halve it at
// the same elements and give the same bits). Returns the bucket's element count.
int64_t PackedAdasumRanges(const std::vector<TensorEntry*>& entries,
                           std::vector<ElementRange>* ranges);

// Replaces `count` elements of `dtype` at `data`, host memory holding the packed tensors `tensors`,
// by `postscale` times the Adasum over `comm` of `prescale` times them, as AdasumInPlace combines.
// float32 and float64 are scaled and combined where they lie; float16 and bfloat16 are widened to
// float32, scaled and combined there, and narrowed back, so that a large prescale undone by the
// postscale does not overflow 16 bits in between. Every caller that packs a bucket the same way
// (the MPI plane, the device backends staging through the host) gets the same bits.
Status AdasumBuffer(void* data, DataType dtype, int64_t count,
                    const std::vector<ElementRange>& tensors, double prescale, double postscale,
                    MPI_Comm comm, AdasumScratch* scratch);

inline bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace gradsync
