#include "gradsync/types.h"

namespace gradsync {

bool IsValidDataType(DataType dtype) { return DataTypeSize(dtype) != 0; }

bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

std::string DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return "uint8";
    case DataType::kInt8:
      return "int8";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
  }
  return "invalid(" + std::to_string(static_cast<int>(dtype)) + ")";
}

std::string ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
    case ReduceOp::kAdasum:
      return "adasum";
  }
  return "invalid(" + std::to_string(static_cast<int>(op)) + ")";
}

std::string DeviceName(const Device& device) {
  switch (device.kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda:" + std::to_string(device.index);
  }
  return "invalid(" + std::to_string(static_cast<int>(device.kind)) + ")";
}

// Overflow is detected by the multiplication itself: every enqueue and every bucket sizes its
// tensors, and a division per dimension cost more than the rest of the arithmetic.
std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += "x";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace gradsync
