#include "ops/scale.h"

#include <algorithm>
#include <cmath>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/scale_element.h"
#include "runtime/half.h"

// The build targets baseline x86-64 (SSE2), where the 16-bit conversions run about 2.4x slower
// than with AVX2. GCC clones each entry point for both and picks one at load time; flatten inlines
// the kernels into each clone so they are compiled for its instruction set.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define GRADSYNC_KERNEL __attribute__((target_clones("default", "avx2"), flatten))
#else
#define GRADSYNC_KERNEL
#endif

namespace gradsync {
namespace {

// Loops run over fixed-size blocks staged in a local array. The fixed trip count lets GCC's -O2
// (very cheap) vectorizer take the loop without an epilogue, and the local array cannot alias the
// source, so no runtime overlap check is needed even though src may equal dst.
constexpr int64_t kBlock = 32;

template <typename T, typename Fn>
void MapBlocks(const T* src, T* dst, int64_t n, Fn fn) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T block[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) block[j] = fn(src[i + j]);
    std::memcpy(dst + i, block, sizeof(block));
  }
  for (; i < n; ++i) dst[i] = fn(src[i]);
}

template <typename T, typename Fn>
void ZipBlocks(const T* in, T* inout, int64_t n, Fn fn) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T block[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) block[j] = fn(inout[i + j], in[i + j]);
    std::memcpy(inout + i, block, sizeof(block));
  }
  for (; i < n; ++i) inout[i] = fn(inout[i], in[i]);
}

[[noreturn]] void DieOnBadArgument(const char* function, DataType dtype, ReduceOp op) {
  std::fprintf(stderr, "gradsync: internal error: %s called with dtype %s, op %s\n", function,
               DataTypeName(dtype).c_str(), ReduceOpName(op).c_str());
  std::abort();
}

template <typename T>
void ScaleIntegers(const void* src, void* dst, int64_t n, double factor) {
  MapBlocks(static_cast<const T*>(src), static_cast<T*>(dst), n,
            [factor](T x) { return ScaleElement<T>(x, factor); });
}

template <typename T>
void ScaleFloats(const void* src, void* dst, int64_t n, T factor) {
  MapBlocks(static_cast<const T*>(src), static_cast<T*>(dst), n,
            [factor](T x) { return x * factor; });
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ScaleHalves(const void* src, void* dst, int64_t n, float factor) {
  MapBlocks(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), n,
            [factor](uint16_t x) { return FromFloat(ToFloat(x) * factor); });
}

// Min and max propagate NaN so that a diverged rank is visible in the result whatever the
// reduction order.
template <typename T>
T MinNan(T a, T b) {
  return ((a < b) | (a != a)) ? a : b;
}
template <typename T>
T MaxNan(T a, T b) {
  return ((a > b) | (a != a)) ? a : b;
}

// Calls apply(fn) with the two-operand function of `op` on floating values of type T, and returns
// whether `op` is known. Average is a sum: the postscale divides afterwards.
template <typename T, typename Apply>
bool WithFloatOp(ReduceOp op, Apply apply) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      apply([](T a, T b) { return a + b; });
      return true;
    case ReduceOp::kProduct:
      apply([](T a, T b) { return a * b; });
      return true;
    case ReduceOp::kMin:
      apply([](T a, T b) { return MinNan(a, b); });
      return true;
    case ReduceOp::kMax:
      apply([](T a, T b) { return MaxNan(a, b); });
      return true;
    case ReduceOp::kAdasum:  // not a fold of two operands (ops/mpi/adasum.h)
      return false;
  }
  return false;
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), typename Fn>
void ReduceHalves(const void* in, void* inout, int64_t n, Fn fn) {
  ZipBlocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), n,
            [fn](uint16_t a, uint16_t b) { return FromFloat(fn(ToFloat(a), ToFloat(b))); });
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
bool ReduceHalvesWithOp(const void* in, void* inout, int64_t n, ReduceOp op) {
  return WithFloatOp<float>(op,
                            [&](auto fn) { ReduceHalves<ToFloat, FromFloat>(in, inout, n, fn); });
}

// out[i] = a[i] (fn) b[i], in blocks as above.
template <typename T, typename Fn>
void ZipInto(const T* a, const T* b, T* out, int64_t n, Fn fn) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T block[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) block[j] = fn(a[i + j], b[i + j]);
    std::memcpy(out + i, block, sizeof(block));
  }
  for (; i < n; ++i) out[i] = fn(a[i], b[i]);
}

// Folds the inputs in order with two-operand passes, each a loop GCC vectorizes.
template <typename T, typename Fn>
void FoldNative(const void* const* inputs, int num_inputs, void* out, int64_t n, Fn fn) {
  auto* dst = static_cast<T*>(out);
  if (num_inputs == 1) {
    std::memcpy(dst, inputs[0], static_cast<size_t>(n) * sizeof(T));
    return;
  }
  ZipInto(static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]), dst, n, fn);
  for (int q = 2; q < num_inputs; ++q) ZipBlocks(static_cast<const T*>(inputs[q]), dst, n, fn);
}

// Integer sums and products wrap around, as MPI's do; computed unsigned because signed overflow is
// undefined in C++.
template <typename T>
bool FoldInteger(const void* const* inputs, int num_inputs, void* out, int64_t n, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      FoldNative<T>(inputs, num_inputs, out, n, [](T a, T b) { return T(U(U(a) + U(b))); });
      return true;
    case ReduceOp::kProduct:
      FoldNative<T>(inputs, num_inputs, out, n, [](T a, T b) { return T(U(U(a) * U(b))); });
      return true;
    case ReduceOp::kMin:
      FoldNative<T>(inputs, num_inputs, out, n, [](T a, T b) { return b < a ? b : a; });
      return true;
    case ReduceOp::kMax:
      FoldNative<T>(inputs, num_inputs, out, n, [](T a, T b) { return b > a ? b : a; });
      return true;
    case ReduceOp::kAdasum:  // floating point only
      return false;
  }
  return false;
}

template <typename T>
bool FoldFloat(const void* const* inputs, int num_inputs, void* out, int64_t n, ReduceOp op) {
  return WithFloatOp<T>(op, [&](auto fn) { FoldNative<T>(inputs, num_inputs, out, n, fn); });
}

// Every input is widened and folded in float32, scaled, and rounded to 16 bits once.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), typename Fn>
void FoldHalves(const void* const* inputs, int num_inputs, void* out, int64_t n, float factor,
                Fn fn) {
  auto* dst = static_cast<uint16_t*>(out);
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t len = std::min(kBlock, n - i0);
    float acc[kBlock];
    const auto* first = static_cast<const uint16_t*>(inputs[0]) + i0;
    for (int64_t j = 0; j < len; ++j) acc[j] = ToFloat(first[j]);
    for (int q = 1; q < num_inputs; ++q) {
      const auto* in = static_cast<const uint16_t*>(inputs[q]) + i0;
      for (int64_t j = 0; j < len; ++j) acc[j] = fn(acc[j], ToFloat(in[j]));
    }
    for (int64_t j = 0; j < len; ++j) dst[i0 + j] = FromFloat(acc[j] * factor);
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
bool FoldHalvesWithOp(const void* const* inputs, int num_inputs, void* out, int64_t n, ReduceOp op,
                      float factor) {
  return WithFloatOp<float>(
      op, [&](auto fn) { FoldHalves<ToFloat, FromFloat>(inputs, num_inputs, out, n, factor, fn); });
}

}  // namespace

GRADSYNC_KERNEL void ScaleElements(const void* src, void* dst, int64_t count, DataType dtype,
                                   double factor) {
  if (count <= 0) return;
  const auto ffactor = static_cast<float>(factor);
  switch (dtype) {
    case DataType::kUInt8:
      return ScaleIntegers<uint8_t>(src, dst, count, factor);
    case DataType::kInt8:
      return ScaleIntegers<int8_t>(src, dst, count, factor);
    case DataType::kInt32:
      return ScaleIntegers<int32_t>(src, dst, count, factor);
    case DataType::kInt64:
      return ScaleIntegers<int64_t>(src, dst, count, factor);
    case DataType::kFloat16:
      return ScaleHalves<HalfToFloat, FloatToHalf>(src, dst, count, ffactor);
    case DataType::kBFloat16:
      return ScaleHalves<BFloat16ToFloat, FloatToBFloat16>(src, dst, count, ffactor);
    case DataType::kFloat32:
      return ScaleFloats<float>(src, dst, count, ffactor);
    case DataType::kFloat64:
      return ScaleFloats<double>(src, dst, count, factor);
  }
  DieOnBadArgument("ScaleElements", dtype, ReduceOp::kSum);
}

GRADSYNC_KERNEL void ReduceHalfPrecision(const void* in, void* inout, int64_t count, DataType dtype,
                                         ReduceOp op) {
  bool handled = false;
  if (dtype == DataType::kFloat16) {
    handled = ReduceHalvesWithOp<HalfToFloat, FloatToHalf>(in, inout, count, op);
  } else if (dtype == DataType::kBFloat16) {
    handled = ReduceHalvesWithOp<BFloat16ToFloat, FloatToBFloat16>(in, inout, count, op);
  }
  if (!handled) DieOnBadArgument("ReduceHalfPrecision", dtype, op);
}

GRADSYNC_KERNEL void CombineInto(const void* const* inputs, int num_inputs, void* out,
                                 int64_t count, DataType dtype, ReduceOp op, double postscale) {
  if (count <= 0) return;
  if (num_inputs < 1) DieOnBadArgument("CombineInto", dtype, op);
  bool handled = false;
  switch (dtype) {
    case DataType::kUInt8:
      handled = FoldInteger<uint8_t>(inputs, num_inputs, out, count, op);
      break;
    case DataType::kInt8:
      handled = FoldInteger<int8_t>(inputs, num_inputs, out, count, op);
      break;
    case DataType::kInt32:
      handled = FoldInteger<int32_t>(inputs, num_inputs, out, count, op);
      break;
    case DataType::kInt64:
      handled = FoldInteger<int64_t>(inputs, num_inputs, out, count, op);
      break;
    case DataType::kFloat32:
      handled = FoldFloat<float>(inputs, num_inputs, out, count, op);
      break;
    case DataType::kFloat64:
      handled = FoldFloat<double>(inputs, num_inputs, out, count, op);
      break;
    case DataType::kFloat16:
      // The scale is applied before rounding, so the result is rounded once.
      if (!FoldHalvesWithOp<HalfToFloat, FloatToHalf>(inputs, num_inputs, out, count, op,
                                                      static_cast<float>(postscale))) {
        DieOnBadArgument("CombineInto", dtype, op);
      }
      return;
    case DataType::kBFloat16:
      if (!FoldHalvesWithOp<BFloat16ToFloat, FloatToBFloat16>(inputs, num_inputs, out, count, op,
                                                              static_cast<float>(postscale))) {
        DieOnBadArgument("CombineInto", dtype, op);
      }
      return;
  }
  if (!handled) DieOnBadArgument("CombineInto", dtype, op);
  if (postscale != 1.0) ScaleElements(out, out, count, dtype, postscale);
}

namespace {

template <typename T>
T IdentityOf(ReduceOp op) {
  using Limits = std::numeric_limits<T>;
  switch (op) {
    case ReduceOp::kProduct:
      return T(1);
    case ReduceOp::kMin:
      return Limits::has_infinity ? Limits::infinity() : Limits::max();
    case ReduceOp::kMax:
      return Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
    default:
      return T(0);
  }
}

template <typename T>
void FillWith(void* dst, int64_t count, T value) {
  std::fill_n(static_cast<T*>(dst), count, value);
}

}  // namespace

void FillReductionIdentity(void* dst, int64_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8:
      return FillWith(dst, count, IdentityOf<uint8_t>(op));
    case DataType::kInt8:
      return FillWith(dst, count, IdentityOf<int8_t>(op));
    case DataType::kInt32:
      return FillWith(dst, count, IdentityOf<int32_t>(op));
    case DataType::kInt64:
      return FillWith(dst, count, IdentityOf<int64_t>(op));
    case DataType::kFloat16:
      return FillWith(dst, count, FloatToHalf(IdentityOf<float>(op)));
    case DataType::kBFloat16:
      return FillWith(dst, count, FloatToBFloat16(IdentityOf<float>(op)));
    case DataType::kFloat32:
      return FillWith(dst, count, IdentityOf<float>(op));
    case DataType::kFloat64:
      return FillWith(dst, count, IdentityOf<double>(op));
  }
}

void FillJoinedContribution(void* dst, int64_t count, DataType dtype, ReduceOp op,
                            double prescale) {
  ReduceOp fill = op;
  if (prescale == 0.0) {
    fill = ReduceOp::kSum;
  } else if (prescale < 0.0 && op == ReduceOp::kMin) {
    fill = ReduceOp::kMax;
  } else if (prescale < 0.0 && op == ReduceOp::kMax) {
    fill = ReduceOp::kMin;
  }
  FillReductionIdentity(dst, count, dtype, fill);
}

}  // namespace gradsync
