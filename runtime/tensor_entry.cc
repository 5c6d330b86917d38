#include "runtime/tensor_entry.h"

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

void TensorEntry::Clear() {
  std::string kept_name = std::move(name);
  std::string kept_group = std::move(group);
  std::vector<int64_t> kept_input_shape = std::move(input.shape);
  std::vector<int64_t> kept_output_shape = std::move(output.shape);
  std::vector<int64_t> kept_splits = std::move(splits);
  *this = TensorEntry();
  kept_name.clear();
  kept_group.clear();
  kept_input_shape.clear();
  kept_output_shape.clear();
  kept_splits.clear();
  name = std::move(kept_name);
  group = std::move(kept_group);
  input.shape = std::move(kept_input_shape);
  output.shape = std::move(kept_output_shape);
  splits = std::move(kept_splits);
}

}  // namespace gradsync
