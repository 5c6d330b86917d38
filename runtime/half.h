// Conversions between float and the 16-bit floating-point formats (IEEE binary16 and bfloat16),
// rounding to nearest even. NaN stays NaN; out-of-range values become infinity.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

namespace gradsync {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace gradsync
