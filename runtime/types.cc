#include "gradsync/types.h"

#include <limits>

namespace gradsync {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
      return 1;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

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

bool IsValidReduceOp(ReduceOp op) { return static_cast<int>(op) < kNumReduceOps; }

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

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

int64_t TensorView::num_bytes() const {
  const int64_t n = num_elements();
  const auto size = static_cast<int64_t>(DataTypeSize(dtype));
  if (n < 0 || size == 0) return -1;
  if (n > std::numeric_limits<int64_t>::max() / size) return -1;
  return n * size;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += "x";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace gradsync
