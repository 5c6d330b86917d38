// The soak's data: host buffers of any dtype read and written as doubles, the small integer values
// every rank puts into them, and the result each collective must produce, computed the way
// gradsync documents its arithmetic (scaling in the dtype's own precision, integers truncated), so
// that every check is an exact comparison.
//
// Values stay small enough that every dtype, float16 and bfloat16 included, holds every input,
// partial result and output exactly: sums of up to 4 ranks of |v| <= 6 scaled by at most 4,
// minima and maxima of |v| <= 30 (60 unsigned) scaled by at most 4, products of {-1, 1, 2}.
//
// Thread safety: pure functions; a Buffer is used by one thread at a time (gradsync's background
// thread owns it while an operation on it is in flight).
#pragma once

#include <gradsync/gradsync.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradsync {
namespace soak {

// Elements of a shape; an empty shape is a scalar.
int64_t Elements(const std::vector<int64_t>& shape);

// Memory for a step's tensors, kept out of malloc's heap: one large reservation handed out by a
// bump pointer (from any thread: output allocators run on gradsync's thread) and given back to the
// kernel when the step's buffers are dead. The soak's own data then neither fragments the heap nor
// stays resident between steps, so the memory samples show what gradsync and MPI keep.
class StepArena {
 public:
  static StepArena& Get();  // the process's arena
  // 64-byte aligned memory, or nullptr once the reservation is used up.
  void* Allocate(size_t bytes);
  // Every buffer from the arena is dead: release its pages and start over.
  void Reset();
  size_t high_water() const { return high_water_; }
  int64_t overflows() const { return overflows_.load(); }
  void CountOverflow() { overflows_.fetch_add(1); }

 private:
  StepArena();
  unsigned char* base_ = nullptr;
  size_t capacity_ = 0;
  std::atomic<size_t> used_{0};
  size_t high_water_ = 0;
  std::atomic<int64_t> overflows_{0};
};

// A host tensor in StepArena memory (on the heap if the arena is full), or over memory another
// Buffer holds.
class Buffer {
 public:
  Buffer(DataType dtype, std::vector<int64_t> shape);
  // Over `memory`, which must outlive it and hold the shape's bytes.
  Buffer(DataType dtype, std::vector<int64_t> shape, void* memory);
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  TensorView view() { return TensorView(data_, dtype_, shape_); }
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t elements() const { return elements_; }
  int64_t bytes() const { return static_cast<int64_t>(size_); }
  void* data() { return data_; }
  void Set(int64_t i, double value);
  double Get(int64_t i) const;

 private:
  DataType dtype_;
  std::vector<int64_t> shape_;
  int64_t elements_;
  size_t size_;
  unsigned char* data_;
  std::vector<unsigned char> overflow_;
};

// A 64-bit mix of two values (splitmix64 finalizer); the soak's only source of randomness.
uint64_t Mix(uint64_t a, uint64_t b);

// Element `i` of the input that the rank identified by `who` (a global rank) contributes to a
// reduction with `op`, for the operation whose data is keyed by `salt`.
double ReduceInput(ReduceOp op, DataType dtype, uint64_t salt, int who, int64_t i);
// Element `i` of data that is moved, not reduced (allgather, broadcast, alltoall): 0..100.
double MovedValue(uint64_t salt, int who, int64_t i);

// `x * factor` as gradsync scales an element of `dtype` (a factor of 1 leaves it alone).
double Scale(DataType dtype, double x, double factor);

// Element `i` of the reduction over `contributors` (global ranks) with pre- and postscale, where
// an average divides by `divisor` (the set's size; with joined ranks, every rank).
double ExpectedReduction(ReduceOp op, DataType dtype, double prescale, double postscale,
                         int divisor, const std::vector<int>& contributors, uint64_t salt,
                         int64_t i);

}  // namespace soak
}  // namespace gradsync
