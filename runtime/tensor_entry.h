// TensorEntry: one enqueued collective on one rank, from enqueue until its handle completes.
//
// Taken from the TensorQueue's pool by a caller thread, filled, pushed back into the queue, and
// used by the background thread until it releases the entry to the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "runtime/name_key.h"
#include "runtime/op_state.h"
#include "runtime/stream.h"

namespace gradsync {

// Wire values: never renumber, only append.
enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kReducescatter = 4,
  kAlltoall = 5,
  kJoin = 6,
  kAddProcessSet = 7,
  kRemoveProcessSet = 8,
};
constexpr int kNumOpTypes = 9;
std::string OpTypeName(OpType op);

// Called on the background thread once an allgather's, reducescatter's or alltoall's output shape
// is known; returns where to write it (shape's product x dtype size bytes, valid until the handle
// completes), or nullptr to fail the operation.
using OutputAllocator = std::function<void*(const std::vector<int64_t>& shape, DataType dtype)>;

// Copies `from` into an entry's view, reusing the view's shape storage: the per-enqueue copy of a
// one- or two-dimensional shape is then a few stores instead of a library call (push_back within
// capacity is inline; assign is not).
inline void AssignView(const TensorView& from, TensorView* to) {
  to->data = from.data;
  to->dtype = from.dtype;
  to->device = from.device;
  to->shape.clear();
  for (int64_t d : from.shape) to->shape.push_back(d);
}

// One piece of a host tensor kept in pieces (TensorEntry::segments).
struct HostSegment {
  void* data = nullptr;
  int64_t elements = 0;
};

// The fields every operation uses come first, the small ones in the first cache line, so that each
// of the passes a step makes over its entries (negotiation, planning, copies, completion) touches
// as few lines per entry as possible; the fields of rarer operations come last.
struct TensorEntry {
  // HashName(name), set by TensorQueue when the entry is pushed (the name is final by then).
  size_t name_hash = 0;
  OpType op = OpType::kAllreduce;
  ReduceOp reduce_op = ReduceOp::kSum;
  // Between TensorQueue's Push and Release; written only under the queue's lock.
  bool in_flight = false;
  int root = 0;
  // Grouped operations: the number of tensors, negotiated and run together (0: not grouped).
  int group_size = 0;
  // The process set it runs in (0: every rank). Add/remove process set: the agreed-on values
  // (the sorted member ranks, or the id to remove) travel in `splits`.
  int32_t process_set = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  // Kept across Clear() for OpState::Renew.
  std::shared_ptr<OpState> state;
  std::string name;
  TensorView input;
  // Allreduce: where the result goes (the input itself when in place). Allgather, reducescatter,
  // alltoall: set once the allocator has run. Broadcast: the input. Barrier: unused.
  TensorView output;
  // A host allreduce of a tensor kept in pieces (AllreduceBatch's buckets): when not null, the
  // tensor is these `segment_count` pieces end to end, reduced in place, and `input` and `output`
  // give only its dtype, shape and device (their data is null). The pieces are the caller's until
  // the operation completes. The data plane only copies through them: which collectives run never
  // depends on them, so ranks may differ in whether a tensor is kept in pieces.
  const HostSegment* segments = nullptr;
  size_t segment_count = 0;
  // Grouped operations: the group's name.
  std::string group;
  // Alltoall: rows of the first dimension sent to each rank, in rank order; empty for even splits.
  std::vector<int64_t> splits;
  OutputAllocator allocator;
  // Device tensors: completes once the producer has written the input (a CUDA event recorded on
  // the producer's stream). The communication stream waits for it on the device; null when the
  // input is ready at enqueue.
  std::shared_ptr<StreamEvent> ready;
  // Device tensors given with their producer's stream (a cudaStream_t) and no event: `ready` is
  // still to be recorded there, by the enqueue or, once the set is locked, by the cycle that takes
  // the entry (ops/device/producer_readiness.h). Null once recorded, and for every other entry.
  void* ready_stream = nullptr;
  // The caller's blocking waits on operations before this entry was enqueued (Runtime's count).
  // A locked plan never fuses entries enqueued on either side of a wait: the caller may have
  // needed the first one's result before it enqueued the second.
  uint64_t waits_before = 0;

  // Back to a default entry, keeping the name's and shapes' storage so that a recycled entry is
  // filled without allocating. A new field must be reset there too (tensor_queue_test checks).
  void Clear();

  // The name with its hash, valid while the entry is in flight.
  NameKey key() const { return NameKey(name, name_hash); }
};

// The entry's allocator called for an output of `shape` in the entry's dtype, or nullptr where it
// has none. An allocator comes from a binding and may throw (a framework's out-of-memory error);
// no exception may cross the background thread, so a throw gives nullptr too, and its message
// goes to *thrown.
void* AllocateOutputMemory(const TensorEntry& entry, const std::vector<int64_t>& shape,
                           std::string* thrown) noexcept;
// The failure of an output of `shape` that AllocateOutputMemory gave no memory for.
Status NoOutputMemory(const std::vector<int64_t>& shape, const std::string& thrown);

}  // namespace gradsync
