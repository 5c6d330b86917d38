// How one element is scaled, shared by the host kernels (ops/scale.cc) and the device batched copy
// (ops/device/), so that a tensor scaled on either side gets the same bits: floating types multiply
// in their own precision, float16 and bfloat16 in float32, integers divide exactly by n for a
// factor of 1/n and otherwise multiply in double, truncated toward zero and saturated.
//
// Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "runtime/half.h"
#include "runtime/host_device.h"

namespace gradsync {
namespace scale_internal {

// A factor like 1/49 is inexact in binary, so 49 * (1/49) lands just below 1. A product within
// rounding error of an integer is taken as that integer before truncating, so an average of
// integers is exact whenever the true quotient is whole. The error of a rounded factor times a
// rounded product is at most about one epsilon of the value; a wider tolerance would also snap
// true fractions of large values (1700000000000001.5, exact in a double, to ...002). A value half
// way is never snapped: there a double holds the half exactly.
GRADSYNC_HOST_DEVICE inline double SnapToInteger(double v) {
  constexpr double kRoundingError = std::numeric_limits<double>::epsilon() * (1.0 + 1e-6);
  const double nearest = nearbyint(v);
  const double magnitude = fabs(v);
  const double off = fabs(v - nearest);
  return off < 0.5 && off <= kRoundingError * (magnitude > 1.0 ? magnitude : 1.0) ? nearest : v;
}

// Saturates instead of converting an out-of-range double, which C++ leaves undefined; NaN (only
// possible from a NaN or infinite factor) becomes 0. Selects rather than branches keep the loop
// vectorizable.
template <typename T>
GRADSYNC_HOST_DEVICE inline T TruncateToInteger(double v) {
  constexpr double kMin = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double kMax = static_cast<double>(std::numeric_limits<T>::max());
  v = v != v ? 0.0 : v;
  v = v < kMin ? kMin : v;
  if constexpr (std::numeric_limits<T>::digits < std::numeric_limits<double>::digits) {
    v = v > kMax ? kMax : v;
    return static_cast<T>(v);
  } else {
    // kMax rounded up to 2^63, one past the largest int64.
    return v >= kMax ? std::numeric_limits<T>::max() : static_cast<T>(v);
  }
}

}  // namespace scale_internal

// Storage types of the data types, for the element functions below.
struct Float16Bits {
  uint16_t bits;
};
struct BFloat16Bits {
  uint16_t bits;
};

template <typename T>
GRADSYNC_HOST_DEVICE inline T ScaleElement(T x, double factor) {
  if constexpr (std::is_floating_point_v<T>) {
    return x * static_cast<T>(factor);
  } else {
    // A factor of 1/n (an average over n ranks, a prescale of 1/10): an integer division, which
    // truncates toward zero exactly at any magnitude, where a double holds neither every int64
    // nor every fraction of a large one.
    const double inverse = 1.0 / factor;
    const double divisor = nearbyint(inverse);
    if (divisor >= 1.0 && divisor <= 4294967296.0 &&
        fabs(inverse - divisor) <= 4 * std::numeric_limits<double>::epsilon() * divisor) {
      return static_cast<T>(static_cast<int64_t>(x) / static_cast<int64_t>(divisor));
    }
    return scale_internal::TruncateToInteger<T>(
        scale_internal::SnapToInteger(static_cast<double>(x) * factor));
  }
}

template <>
GRADSYNC_HOST_DEVICE inline Float16Bits ScaleElement(Float16Bits x, double factor) {
  return {FloatToHalf(HalfToFloat(x.bits) * static_cast<float>(factor))};
}

template <>
GRADSYNC_HOST_DEVICE inline BFloat16Bits ScaleElement(BFloat16Bits x, double factor) {
  return {FloatToBFloat16(BFloat16ToFloat(x.bits) * static_cast<float>(factor))};
}

}  // namespace gradsync
