#include "runtime/tensor_entry.h"

#include <exception>

namespace gradsync {

std::string OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce:
      return "allreduce";
    case OpType::kAllgather:
      return "allgather";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kReducescatter:
      return "reducescatter";
    case OpType::kAlltoall:
      return "alltoall";
    case OpType::kJoin:
      return "join";
    case OpType::kAddProcessSet:
      return "add_process_set";
    case OpType::kRemoveProcessSet:
      return "remove_process_set";
  }
  return "invalid(" + std::to_string(static_cast<int>(op)) + ")";
}

namespace {

void ClearView(TensorView* view) {
  view->data = nullptr;
  view->dtype = DataType::kFloat32;
  view->shape.clear();
  view->device = Device::Cpu();
}

}  // namespace

// Field by field rather than assigning a fresh entry: this runs for every completed tensor, and
// assigning would free and reallocate the strings' and vectors' storage.
void TensorEntry::Clear() {
  name.clear();
  name_hash = 0;
  op = OpType::kAllreduce;
  ClearView(&input);
  ClearView(&output);
  reduce_op = ReduceOp::kSum;
  prescale = 1.0;
  postscale = 1.0;
  root = 0;
  segments = nullptr;
  segment_count = 0;
  splits.clear();
  group.clear();
  group_size = 0;
  process_set = 0;
  allocator = nullptr;
  ready = nullptr;
  ready_stream = nullptr;
  waits_before = 0;
  in_flight = false;
  // `state` stays: the next operation on this entry reuses it (OpState::Renew).
}

void* AllocateOutputMemory(const TensorEntry& entry, const std::vector<int64_t>& shape,
                           std::string* thrown) noexcept {
  if (!entry.allocator) return nullptr;
  try {
    return entry.allocator(shape, entry.input.dtype);
  } catch (const std::exception& e) {
    try {
      *thrown = e.what();
    } catch (...) {  // no memory for the message either
    }
  } catch (...) {
    try {
      *thrown = "an exception that is not a std::exception";
    } catch (...) {
    }
  }
  return nullptr;
}

Status NoOutputMemory(const std::vector<int64_t>& shape, const std::string& thrown) {
  return Status::InvalidArgument("the output allocator gave no memory for shape " +
                                 ShapeString(shape) +
                                 (thrown.empty() ? "" : "; it threw: " + thrown));
}

}  // namespace gradsync
