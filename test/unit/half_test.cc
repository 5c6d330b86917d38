#include "runtime/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace gradsync {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }
bool IsBFloat16Nan(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; }

// The value a binary16 pattern stands for, computed from its fields.
double HalfValue(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000u) ? -magnitude : magnitude;
}

// Checks that `rounded` is the nearest pattern to `f` among its neighbours, ties going to the even
// one. Neighbour patterns of the same sign are one step apart, and differences of values in these
// formats are exact in double.
template <float (*ToFloat)(uint16_t)>
void ExpectNearestEven(float f, uint16_t rounded) {
  const double exact = f;
  const double error = std::fabs(exact - ToFloat(rounded));
  const uint16_t neighbours[] = {static_cast<uint16_t>(rounded + 1),
                                 static_cast<uint16_t>(rounded - 1)};
  for (uint16_t n : neighbours) {
    if ((n & 0x8000u) != (rounded & 0x8000u) || std::isnan(ToFloat(n))) continue;
    const double other = std::fabs(exact - ToFloat(n));
    EXPECT_LE(error, other) << "f=" << f << " rounded=" << rounded;
    if (error == other) {
      EXPECT_EQ(rounded & 1u, 0u) << "tie not to even for f=" << f;
    }
  }
}

TEST(HalfTest, EveryPatternRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xFFFFu; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = HalfToFloat(h);
    if (IsHalfNan(h)) {
      EXPECT_TRUE(std::isnan(f)) << bits;
      EXPECT_TRUE(IsHalfNan(FloatToHalf(f))) << bits;
      EXPECT_EQ(std::signbit(f), (h & 0x8000u) != 0) << bits;
      continue;
    }
    if ((h & 0x7FFFu) != 0x7C00u) {
      EXPECT_EQ(static_cast<double>(f), HalfValue(h)) << bits;
    }
    EXPECT_EQ(FloatToHalf(f), h) << bits;
  }
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
}

TEST(HalfTest, OverflowBecomesInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // halfway: ties to the even 2^16, which overflows
  EXPECT_EQ(FloatToHalf(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalf(inf), 0x7C00);
  EXPECT_EQ(FloatToHalf(-inf), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7C00);
}

TEST(HalfTest, TiesRoundToEven) {
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // 1 + half ulp -> 1
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // 1 + 1.5 ulp -> 1 + 2 ulp
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -12)), 0x3C00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -12)), 0x3C01);  // above halfway
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);             // subnormal tie -> 0
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);         // subnormal tie -> even
  EXPECT_EQ(FloatToHalf(2049.0f), FloatToHalf(2048.0f));
  EXPECT_EQ(FloatToHalf(2051.0f), FloatToHalf(2052.0f));
}

TEST(HalfTest, NanStaysNan) {
  EXPECT_TRUE(IsHalfNan(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsHalfNan(FloatToHalf(FromBits(0x7F800001u))));  // payload only in low bits
  EXPECT_TRUE(IsHalfNan(FloatToHalf(FromBits(0xFFC00000u))));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7C01)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0xFE00)));
}

TEST(HalfTest, SampledFloatsRoundToNearestEven) {
  constexpr uint64_t kStride = 1021;  // prime, so every exponent and many mantissas are visited
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += kStride) {
    const float f = FromBits(static_cast<uint32_t>(bits));
    const uint16_t h = FloatToHalf(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(IsHalfNan(h)) << bits;
    } else if (std::fabs(f) >= 65520.0f) {
      EXPECT_EQ(h & 0x7FFFu, 0x7C00u) << bits;
    } else {
      ExpectNearestEven<HalfToFloat>(f, h);
    }
    if (std::signbit(f) != ((h & 0x8000u) != 0)) ADD_FAILURE() << "sign lost for " << bits;
  }
}

TEST(BFloat16Test, EveryPatternRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xFFFFu; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    const float f = BFloat16ToFloat(b);
    uint32_t fbits;
    std::memcpy(&fbits, &f, sizeof(f));
    EXPECT_EQ(fbits, bits << 16);
    if (IsBFloat16Nan(b)) {
      EXPECT_TRUE(IsBFloat16Nan(FloatToBFloat16(f))) << bits;
    } else {
      EXPECT_EQ(FloatToBFloat16(f), b) << bits;
    }
  }
}

TEST(BFloat16Test, KnownValues) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0x7F7F), FromBits(0x7F7F0000u));   // largest finite
  EXPECT_EQ(BFloat16ToFloat(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_EQ(FloatToBFloat16(std::ldexp(1.0f, -133)), 0x0001);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xFF80);
}

TEST(BFloat16Test, OverflowBecomesInfinity) {
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7F7F7FFFu)), 0x7F7F);  // just below the halfway point
}

TEST(BFloat16Test, TiesRoundToEven) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3F808000u)), 0x3F80);  // halfway, even below
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3F818000u)), 0x3F82);  // halfway, even above
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3F808001u)), 0x3F81);  // above halfway
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3F807FFFu)), 0x3F80);  // below halfway
  EXPECT_EQ(FloatToBFloat16(257.0f), 0x4380);                 // 257 ties to 256
}

TEST(BFloat16Test, NanStaysNan) {
  EXPECT_TRUE(IsBFloat16Nan(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsBFloat16Nan(FloatToBFloat16(FromBits(0x7F800001u))));  // rounding gives inf bits
  EXPECT_TRUE(IsBFloat16Nan(FloatToBFloat16(FromBits(0xFFFFFFFFu))));  // rounding wraps to +0
  EXPECT_EQ(FloatToBFloat16(FromBits(0xFF800001u)) & 0x8000u, 0x8000u);
}

TEST(BFloat16Test, SampledFloatsRoundToNearestEven) {
  constexpr uint64_t kStride = 1021;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += kStride) {
    const float f = FromBits(static_cast<uint32_t>(bits));
    const uint16_t b = FloatToBFloat16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(IsBFloat16Nan(b)) << bits;
    } else if (std::isinf(f)) {
      EXPECT_EQ(b & 0x7FFFu, 0x7F80u) << bits;
    } else if (std::isinf(BFloat16ToFloat(b))) {
      EXPECT_GE(std::fabs(f), FromBits(0x7F7F8000u)) << bits;  // overflowed past the halfway
    } else {
      ExpectNearestEven<BFloat16ToFloat>(f, b);
    }
  }
}

}  // namespace
}  // namespace gradsync
