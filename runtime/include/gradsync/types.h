// Vocabulary types shared by the public API and every layer: data types, reduce ops, devices and
// the non-owning tensor view that any framework adapts to.
//
// Thread safety: plain values; distinct objects may be used from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gradsync {

// Wire values: never renumber, only append.
enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
};
constexpr int kNumDataTypes = 8;

// Wire values: never renumber, only append.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  // Horovod's adaptive summation (ops/mpi/adasum.h): allreduce of floating-point tensors (a
  // device's combined on the host) on a process set of a power-of-two size.
  kAdasum = 5,
};
constexpr int kNumReduceOps = 6;

// Wire values: never renumber, only append.
enum class DeviceKind : uint8_t {
  kCpu = 0,
  kCuda = 1,
};

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = -1;  // CUDA ordinal; -1 for host memory

  static Device Cpu() { return {}; }
  static Device Cuda(int ordinal) { return {DeviceKind::kCuda, ordinal}; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Bytes per element; 0 for a value outside the enum. Inline: every tensor is sized several times.
inline size_t DataTypeSize(DataType dtype) {
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
// "float32", "bfloat16", ...; "invalid(<n>)" for a value outside the enum.
std::string DataTypeName(DataType dtype);
bool IsValidDataType(DataType dtype);
bool IsFloatingPoint(DataType dtype);

std::string ReduceOpName(ReduceOp op);
inline bool IsValidReduceOp(ReduceOp op) { return static_cast<int>(op) < kNumReduceOps; }

std::string DeviceName(const Device& device);

// A non-owning view of a dense, contiguous (row-major) tensor. The caller keeps `data` alive and
// untouched until the operation that uses it completes.
struct TensorView {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;  // empty shape = scalar (one element)
  Device device;

  TensorView() = default;
  TensorView(void* d, DataType t, std::vector<int64_t> s, Device dev = Device::Cpu())
      : data(d), dtype(t), shape(std::move(s)), device(dev) {}

  // Product of the dimensions; -1 if a dimension is negative or if the product of the non-zero
  // dimensions overflows int64. Zeros are left out of that test so that a shape's validity does
  // not depend on its order and every slice of a valid tensor (an allgather row, a reducescatter
  // share) can be sized without overflow, even when the tensor itself is empty.
  int64_t num_elements() const {
    int64_t n = 1;
    bool empty = false;
    for (int64_t d : shape) {
      if (d < 0) return -1;
      if (d == 0) {
        empty = true;
      } else if (__builtin_mul_overflow(n, d, &n)) {
        return -1;
      }
    }
    return empty ? 0 : n;
  }
  // num_elements() * element size; -1 when num_elements() is -1, the dtype is unknown, or the
  // byte count of the non-zero dimensions overflows (as for num_elements()).
  int64_t num_bytes() const {
    const auto size = static_cast<int64_t>(DataTypeSize(dtype));
    int64_t bytes = size;
    bool empty = false;
    for (int64_t d : shape) {
      if (d < 0) return -1;
      if (d == 0) {
        empty = true;
      } else if (__builtin_mul_overflow(bytes, d, &bytes)) {
        return -1;
      }
    }
    if (size == 0) return -1;
    return empty ? 0 : bytes;
  }
};

// "[2x3x4]", "[]" for a scalar.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace gradsync
