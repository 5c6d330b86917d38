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
  }
  return "invalid(" + std::to_string(static_cast<int>(op)) + ")";
}

}  // namespace gradsync
