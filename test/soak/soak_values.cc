// The soak's data and expected results; see soak_values.h.
#include "test/soak/soak_values.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/half.h"

namespace gradsync {
namespace soak {
namespace {

template <typename T>
void Put(unsigned char* base, int64_t i, T v) {
  std::memcpy(base + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

template <typename T>
T Take(const unsigned char* base, int64_t i) {
  T v;
  std::memcpy(&v, base + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

// Integer scaling as gradsync documents it: in double, a near-whole product taken as whole,
// truncated toward zero, saturated at the type's limits.
template <typename T>
double ScaleInteger(double x, double factor) {
  double v = x * factor;
  const double nearest = std::nearbyint(v);
  if (std::abs(v - nearest) <= 1e-12 * std::max(1.0, std::abs(v))) v = nearest;
  v = std::trunc(v);
  v = std::max(v, static_cast<double>(std::numeric_limits<T>::min()));
  return std::min(v, static_cast<double>(std::numeric_limits<T>::max()));
}

double Combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return a + b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kAdasum:  // not in the soak's plans
      break;
  }
  return 0;
}

}  // namespace

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StepArena& StepArena::Get() {
  static StepArena arena;
  return arena;
}

StepArena::StepArena() {
  // Address space only: pages become resident when touched and leave again at Reset.
  capacity_ = size_t{4} << 30;
  void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    capacity_ = 0;
  } else {
    base_ = static_cast<unsigned char*>(p);
  }
}

void* StepArena::Allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) & ~size_t{63};
  const size_t start = used_.fetch_add(rounded);
  if (start + rounded > capacity_) return nullptr;
  return base_ + start;
}

void StepArena::Reset() {
  const size_t used = std::min(used_.load(), capacity_);
  high_water_ = std::max(high_water_, used);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (used > 0) madvise(base_, (used + page - 1) / page * page, MADV_DONTNEED);
  used_.store(0);
}

Buffer::Buffer(DataType dtype, std::vector<int64_t> shape)
    : dtype_(dtype),
      shape_(std::move(shape)),
      elements_(Elements(shape_)),
      size_(static_cast<size_t>(elements_) * DataTypeSize(dtype_)),
      data_(nullptr) {
  if (size_ == 0) return;
  data_ = static_cast<unsigned char*>(StepArena::Get().Allocate(size_));
  if (data_ == nullptr) {
    StepArena::Get().CountOverflow();
    overflow_.resize(size_);
    data_ = overflow_.data();
  }
}

Buffer::Buffer(DataType dtype, std::vector<int64_t> shape, void* memory)
    : dtype_(dtype),
      shape_(std::move(shape)),
      elements_(Elements(shape_)),
      size_(static_cast<size_t>(elements_) * DataTypeSize(dtype_)),
      data_(static_cast<unsigned char*>(memory)) {}

void Buffer::Set(int64_t i, double value) {
  unsigned char* base = data_;
  switch (dtype_) {
    case DataType::kUInt8:
      return Put(base, i, static_cast<uint8_t>(value));
    case DataType::kInt8:
      return Put(base, i, static_cast<int8_t>(value));
    case DataType::kInt32:
      return Put(base, i, static_cast<int32_t>(value));
    case DataType::kInt64:
      return Put(base, i, static_cast<int64_t>(value));
    case DataType::kFloat16:
      return Put(base, i, FloatToHalf(static_cast<float>(value)));
    case DataType::kBFloat16:
      return Put(base, i, FloatToBFloat16(static_cast<float>(value)));
    case DataType::kFloat32:
      return Put(base, i, static_cast<float>(value));
    case DataType::kFloat64:
      return Put(base, i, value);
  }
}

double Buffer::Get(int64_t i) const {
  const unsigned char* base = data_;
  switch (dtype_) {
    case DataType::kUInt8:
      return Take<uint8_t>(base, i);
    case DataType::kInt8:
      return Take<int8_t>(base, i);
    case DataType::kInt32:
      return Take<int32_t>(base, i);
    case DataType::kInt64:
      return static_cast<double>(Take<int64_t>(base, i));
    case DataType::kFloat16:
      return HalfToFloat(Take<uint16_t>(base, i));
    case DataType::kBFloat16:
      return BFloat16ToFloat(Take<uint16_t>(base, i));
    case DataType::kFloat32:
      return Take<float>(base, i);
    case DataType::kFloat64:
      return Take<double>(base, i);
  }
  return 0;
}

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double ReduceInput(ReduceOp op, DataType dtype, uint64_t salt, int who, int64_t i) {
  const uint64_t h = Mix(Mix(salt, static_cast<uint64_t>(who)), static_cast<uint64_t>(i));
  const bool is_unsigned = dtype == DataType::kUInt8;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return is_unsigned ? static_cast<double>(h % 7) : static_cast<double>(h % 13) - 6;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return is_unsigned ? static_cast<double>(h % 61) : static_cast<double>(h % 61) - 30;
    case ReduceOp::kProduct:
      if (is_unsigned) return 1 + static_cast<double>(h % 2);
      return h % 3 == 0 ? -1.0 : static_cast<double>(h % 3);
    case ReduceOp::kAdasum:  // not in the soak's plans
      break;
  }
  return 0;
}

double MovedValue(uint64_t salt, int who, int64_t i) {
  return static_cast<double>(
      Mix(Mix(salt, static_cast<uint64_t>(who) + 0x5151), static_cast<uint64_t>(i)) % 101);
}

double Scale(DataType dtype, double x, double factor) {
  if (factor == 1.0) return x;
  switch (dtype) {
    case DataType::kUInt8:
      return ScaleInteger<uint8_t>(x, factor);
    case DataType::kInt8:
      return ScaleInteger<int8_t>(x, factor);
    case DataType::kInt32:
      return ScaleInteger<int32_t>(x, factor);
    case DataType::kInt64:
      return ScaleInteger<int64_t>(x, factor);
    case DataType::kFloat16: {
      const float product = static_cast<float>(x) * static_cast<float>(factor);
      return HalfToFloat(FloatToHalf(product));
    }
    case DataType::kBFloat16: {
      const float product = static_cast<float>(x) * static_cast<float>(factor);
      return BFloat16ToFloat(FloatToBFloat16(product));
    }
    case DataType::kFloat32: {
      const float product = static_cast<float>(x) * static_cast<float>(factor);
      return product;
    }
    case DataType::kFloat64:
      return x * factor;
  }
  return 0;
}

double ExpectedReduction(ReduceOp op, DataType dtype, double prescale, double postscale,
                         int divisor, const std::vector<int>& contributors, uint64_t salt,
                         int64_t i) {
  double acc = 0;
  bool first = true;
  for (int who : contributors) {
    const double v = Scale(dtype, ReduceInput(op, dtype, salt, who, i), prescale);
    acc = first ? v : Combine(op, acc, v);
    first = false;
  }
  // gradsync folds the average's division into the postscale, in this order.
  const double factor = op == ReduceOp::kAverage ? postscale * (1.0 / divisor) : postscale;
  return Scale(dtype, acc, factor);
}

}  // namespace soak
}  // namespace gradsync
