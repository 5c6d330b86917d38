// Conversions between float and the 16-bit floating-point formats (IEEE binary16 and bfloat16),
// rounding to nearest even. NaN stays NaN; out-of-range values become infinity.
//
// The bodies live here, inline and branch-free, so that the element-wise kernels in ops/ inline
// them and the compiler can vectorize their loops; selects are written as bit masks because GCC
// at -O2 keeps some conditional expressions as branches, which blocks vectorization. They assume
// the default floating-point environment (round to nearest); flush-to-zero modes do not change
// their results.
//
// Thread safety: pure functions. Host code and CUDA kernels share them (GRADSYNC_HOST_DEVICE).
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/host_device.h"

namespace gradsync {
namespace half_internal {

GRADSYNC_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

GRADSYNC_HOST_DEVICE inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace half_internal

GRADSYNC_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  using half_internal::BitsFloat;
  using half_internal::FloatBits;
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // exponent and mantissa, sign shifted out
  // Normal, inf and NaN: place the 5-bit exponent in a float exponent biased by 224 more, then
  // rescale; exponent 31 lands on 255, so inf and NaN carry over.
  const float normal = BitsFloat((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal: the mantissa becomes the low bits of a float in [0.5, 1); subtracting 0.5 leaves
  // mantissa * 2^-24 exactly.
  const float subnormal = BitsFloat((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(two_w < (1u << 27));
  const uint32_t magnitude =
      (FloatBits(subnormal) & is_subnormal) | (FloatBits(normal) & ~is_subnormal);
  return BitsFloat(sign | magnitude);
}

GRADSYNC_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  using half_internal::BitsFloat;
  using half_internal::FloatBits;
  const uint32_t w = FloatBits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  // The 2^112 step sends magnitudes of 2^16 and more to inf (those in [65520, 2^16) overflow in
  // the rounding add below); the net factor of 4 is compensated in that add's exponent.
  float base = (BitsFloat(w & 0x7FFFFFFFu) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;  // half subnormals share one quantum
  // Adding a power of two whose ulp is the target half ulp makes the FPU round to nearest even.
  base = BitsFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = FloatBits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(shl1_w > 0xFF000000u);
  const uint32_t result = (sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan);
  return static_cast<uint16_t>(result);
}

GRADSYNC_HOST_DEVICE inline float BFloat16ToFloat(uint16_t b) {
  return half_internal::BitsFloat(static_cast<uint32_t>(b) << 16);
}

GRADSYNC_HOST_DEVICE inline uint16_t FloatToBFloat16(float f) {
  const uint32_t w = half_internal::FloatBits(f);
  const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  // Rounding a NaN could clear every mantissa bit it keeps or carry into the sign; its top half
  // with the quiet bit forced on stays NaN.
  const uint32_t nan = (w >> 16) | 0x0040u;
  const bool is_nan = (w & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

}  // namespace gradsync
