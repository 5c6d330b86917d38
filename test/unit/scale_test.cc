#include "ops/scale.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "runtime/half.h"

namespace gradsync {
namespace {

const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt32,
                              DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16,
                              DataType::kFloat32, DataType::kFloat64};

template <typename T>
void Store(std::vector<uint8_t>* bytes, size_t i, T value) {
  std::memcpy(bytes->data() + i * sizeof(T), &value, sizeof(T));
}

template <typename T>
T Load(const std::vector<uint8_t>& bytes, size_t i) {
  T value;
  std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
  return value;
}

// Values as raw bytes of `dtype`, with one extra element of guard bytes at the end.
std::vector<uint8_t> Encode(DataType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> bytes((values.size() + 1) * DataTypeSize(dtype), 0xA5);
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    switch (dtype) {
      case DataType::kUInt8:
        Store(&bytes, i, static_cast<uint8_t>(v));
        break;
      case DataType::kInt8:
        Store(&bytes, i, static_cast<int8_t>(v));
        break;
      case DataType::kInt32:
        Store(&bytes, i, static_cast<int32_t>(v));
        break;
      case DataType::kInt64:
        Store(&bytes, i, static_cast<int64_t>(v));
        break;
      case DataType::kFloat16:
        Store(&bytes, i, FloatToHalf(static_cast<float>(v)));
        break;
      case DataType::kBFloat16:
        Store(&bytes, i, FloatToBFloat16(static_cast<float>(v)));
        break;
      case DataType::kFloat32:
        Store(&bytes, i, static_cast<float>(v));
        break;
      case DataType::kFloat64:
        Store(&bytes, i, v);
        break;
    }
  }
  return bytes;
}

double Decode(DataType dtype, const std::vector<uint8_t>& bytes, size_t i) {
  switch (dtype) {
    case DataType::kUInt8:
      return Load<uint8_t>(bytes, i);
    case DataType::kInt8:
      return Load<int8_t>(bytes, i);
    case DataType::kInt32:
      return Load<int32_t>(bytes, i);
    case DataType::kInt64:
      return static_cast<double>(Load<int64_t>(bytes, i));
    case DataType::kFloat16:
      return HalfToFloat(Load<uint16_t>(bytes, i));
    case DataType::kBFloat16:
      return BFloat16ToFloat(Load<uint16_t>(bytes, i));
    case DataType::kFloat32:
      return Load<float>(bytes, i);
    case DataType::kFloat64:
      return Load<double>(bytes, i);
  }
  return 0;
}

bool IsSigned(DataType dtype) { return dtype != DataType::kUInt8; }

// Small integers, exactly representable in every dtype even after scaling by 3 or 0.5.
std::vector<double> SampleValues(DataType dtype, int64_t count) {
  std::vector<double> values(count);
  for (int64_t i = 0; i < count; ++i) {
    const double magnitude = static_cast<double>(i % 11);
    values[i] = IsSigned(dtype) && i % 2 ? -magnitude : magnitude;
  }
  return values;
}

double Expected(DataType dtype, double value, double factor) {
  const double scaled = value * factor;
  return IsFloatingPoint(dtype) ? scaled : std::trunc(scaled);
}

void CheckScaledCopy(DataType dtype, int64_t count, double factor, bool in_place) {
  SCOPED_TRACE(DataTypeName(dtype) + " count " + std::to_string(count) + " factor " +
               std::to_string(factor) + (in_place ? " in place" : " out of place"));
  const std::vector<double> values = SampleValues(dtype, count);
  std::vector<uint8_t> src = Encode(dtype, values);
  const std::vector<uint8_t> original = src;
  std::vector<uint8_t> dst(src.size(), 0x5A);
  std::vector<uint8_t>& out = in_place ? src : dst;
  ScaledCopy(src.data(), out.data(), count, dtype, factor);
  for (int64_t i = 0; i < count; ++i) {
    EXPECT_EQ(Decode(dtype, out, i), Expected(dtype, values[i], factor)) << "element " << i;
  }
  const size_t size = DataTypeSize(dtype);
  const size_t guard = count * size;
  const uint8_t guard_byte = in_place ? 0xA5 : 0x5A;
  for (size_t b = guard; b < guard + size; ++b) EXPECT_EQ(out[b], guard_byte) << "wrote past end";
  if (!in_place) {
    EXPECT_EQ(src, original) << "source modified";
  }
}

TEST(ScaledCopyTest, EveryDtypeFactorCountAndPlacement) {
  for (DataType dtype : kAllTypes) {
    for (double factor : {1.0, 0.5, 3.0}) {
      for (int64_t count : {0, 1, 17, 100}) {
        CheckScaledCopy(dtype, count, factor, /*in_place=*/true);
        CheckScaledCopy(dtype, count, factor, /*in_place=*/false);
      }
    }
  }
}

TEST(ScaledCopyTest, IntegersTruncateTowardZero) {
  const std::vector<uint8_t> src = Encode(DataType::kInt32, {7, -7, 5, -5});
  std::vector<uint8_t> dst(src.size());
  ScaledCopy(src.data(), dst.data(), 4, DataType::kInt32, 0.5);
  EXPECT_EQ(Load<int32_t>(dst, 0), 3);
  EXPECT_EQ(Load<int32_t>(dst, 1), -3);
  ScaledCopy(src.data(), dst.data(), 4, DataType::kInt32, 1.0 / 3);
  EXPECT_EQ(Load<int32_t>(dst, 2), 1);
  EXPECT_EQ(Load<int32_t>(dst, 3), -1);
}

TEST(ScaledCopyTest, IntegersSaturateOutOfRange) {
  std::vector<uint8_t> u8 = Encode(DataType::kUInt8, {200, 1});
  ScaledCopy(u8.data(), u8.data(), 2, DataType::kUInt8, 3.0);
  EXPECT_EQ(Load<uint8_t>(u8, 0), 255);
  ScaledCopy(u8.data(), u8.data(), 2, DataType::kUInt8, -1.0);
  EXPECT_EQ(Load<uint8_t>(u8, 1), 0);

  std::vector<uint8_t> i8 = Encode(DataType::kInt8, {-100, 100});
  ScaledCopy(i8.data(), i8.data(), 2, DataType::kInt8, 3.0);
  EXPECT_EQ(Load<int8_t>(i8, 0), -128);
  EXPECT_EQ(Load<int8_t>(i8, 1), 127);

  std::vector<uint8_t> i64(2 * sizeof(int64_t));
  Store(&i64, 0, std::numeric_limits<int64_t>::max());
  Store(&i64, 1, std::numeric_limits<int64_t>::min());
  ScaledCopy(i64.data(), i64.data(), 2, DataType::kInt64, 3.0);
  EXPECT_EQ(Load<int64_t>(i64, 0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Load<int64_t>(i64, 1), std::numeric_limits<int64_t>::min());

  std::vector<uint8_t> i32 = Encode(DataType::kInt32, {1000000000, 5});
  ScaledCopy(i32.data(), i32.data(), 2, DataType::kInt32, std::nan(""));
  EXPECT_EQ(Load<int32_t>(i32, 0), 0);
}

TEST(ScaledCopyTest, Int64KeepsFullPrecisionAtFactorOne) {
  std::vector<uint8_t> src(sizeof(int64_t)), dst(sizeof(int64_t));
  Store<int64_t>(&src, 0, (int64_t{1} << 60) + 1);  // not representable in double
  ScaledCopy(src.data(), dst.data(), 1, DataType::kInt64, 1.0);
  EXPECT_EQ(Load<int64_t>(dst, 0), (int64_t{1} << 60) + 1);
}

TEST(ScaledCopyTest, HalfPrecisionRoundsOnceFromFloat) {
  const uint16_t one = FloatToHalf(1.0f);
  uint16_t out = 0;
  ScaledCopy(&one, &out, 1, DataType::kFloat16, 1.0 / 3);
  EXPECT_EQ(out, FloatToHalf(1.0f * static_cast<float>(1.0 / 3)));
  const uint16_t b_one = FloatToBFloat16(1.0f);
  ScaledCopy(&b_one, &out, 1, DataType::kBFloat16, 1.0 / 3);
  EXPECT_EQ(out, FloatToBFloat16(static_cast<float>(1.0 / 3)));
}

TEST(ScaledCopyTest, Float32MultipliesInFloat) {
  const float x = 3.0f;
  float out = 0;
  ScaledCopy(&x, &out, 1, DataType::kFloat32, 0.1);
  EXPECT_EQ(out, 3.0f * 0.1f);
  const double y = 3.0;
  double out64 = 0;
  ScaledCopy(&y, &out64, 1, DataType::kFloat64, 0.1);
  EXPECT_EQ(out64, 3.0 * 0.1);
}

std::vector<uint16_t> Halves(DataType dtype, const std::vector<float>& values) {
  std::vector<uint16_t> out;
  for (float v : values) {
    out.push_back(dtype == DataType::kFloat16 ? FloatToHalf(v) : FloatToBFloat16(v));
  }
  return out;
}

std::vector<float> Floats(DataType dtype, const std::vector<uint16_t>& values) {
  std::vector<float> out;
  for (uint16_t v : values) {
    out.push_back(dtype == DataType::kFloat16 ? HalfToFloat(v) : BFloat16ToFloat(v));
  }
  return out;
}

std::vector<float> Reduce(DataType dtype, ReduceOp op, const std::vector<float>& in,
                          const std::vector<float>& inout) {
  const std::vector<uint16_t> a = Halves(dtype, in);
  std::vector<uint16_t> b = Halves(dtype, inout);
  ReduceHalfPrecision(a.data(), b.data(), static_cast<int64_t>(b.size()), dtype, op);
  EXPECT_EQ(a, Halves(dtype, in)) << "input modified";
  return Floats(dtype, b);
}

class ReduceHalfTest : public ::testing::TestWithParam<DataType> {};

TEST_P(ReduceHalfTest, SumMinMaxProduct) {
  const DataType t = GetParam();
  const std::vector<float> in = {1, 2, -3, 0.5, -0.25, 8};
  const std::vector<float> inout = {4, -2, 3, 0.25, -8, 0.125};
  EXPECT_EQ(Reduce(t, ReduceOp::kSum, in, inout),
            (std::vector<float>{5, 0, 0, 0.75, -8.25, 8.125}));
  EXPECT_EQ(Reduce(t, ReduceOp::kAverage, in, inout),
            (std::vector<float>{5, 0, 0, 0.75, -8.25, 8.125}));
  EXPECT_EQ(Reduce(t, ReduceOp::kMin, in, inout), (std::vector<float>{1, -2, -3, 0.25, -8, 0.125}));
  EXPECT_EQ(Reduce(t, ReduceOp::kMax, in, inout), (std::vector<float>{4, 2, 3, 0.5, -0.25, 8}));
  EXPECT_EQ(Reduce(t, ReduceOp::kProduct, in, inout), (std::vector<float>{4, -4, -9, 0.125, 2, 1}));
}

TEST_P(ReduceHalfTest, LongVectorsMatchElementwise) {
  const DataType t = GetParam();
  std::vector<float> in, inout, sum;
  for (int i = 0; i < 100; ++i) {  // past one kernel block, with a tail
    in.push_back(static_cast<float>(i % 13) - 6);
    inout.push_back(static_cast<float>(i % 7));
    sum.push_back(in.back() + inout.back());
  }
  EXPECT_EQ(Reduce(t, ReduceOp::kSum, in, inout), sum);
}

TEST_P(ReduceHalfTest, MinAndMaxPropagateNan) {
  const DataType t = GetParam();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    const std::vector<float> a = Reduce(t, op, {nan, 1}, {1, nan});
    EXPECT_TRUE(std::isnan(a[0])) << ReduceOpName(op);
    EXPECT_TRUE(std::isnan(a[1])) << ReduceOpName(op);
  }
}

TEST(ReduceHalfPrecisionTest, RoundsOnceToNearestEven) {
  // 2048 + 1 is a tie in float16 (spacing 2) and goes to the even 2048; 2048 + 3 goes to 2052.
  EXPECT_EQ(Reduce(DataType::kFloat16, ReduceOp::kSum, {2048, 2048}, {1, 3}),
            (std::vector<float>{2048, 2052}));
  EXPECT_EQ(Reduce(DataType::kBFloat16, ReduceOp::kSum, {256, 256}, {1, 3}),
            (std::vector<float>{256, 260}));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Reduce(DataType::kFloat16, ReduceOp::kSum, {65504}, {65504}), std::vector<float>{inf});
  EXPECT_EQ(Reduce(DataType::kFloat16, ReduceOp::kProduct, {256}, {256}), std::vector<float>{inf});
}

TEST(ReduceHalfPrecisionTest, ZeroCountTouchesNothing) {
  uint16_t a = 1, b = 2;
  ReduceHalfPrecision(&a, &b, 0, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(b, 2);
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, ReduceHalfTest,
                         ::testing::Values(DataType::kFloat16, DataType::kBFloat16),
                         [](const ::testing::TestParamInfo<DataType>& info) {
                           return DataTypeName(info.param);
                         });

TEST(ScaledCopyTest, IntegerAverageIsExactWhenTheQuotientIsWhole) {
  // 49 * (1.0 / 49) is 0.99999999999999989 in binary; the average of 49 ranks' 1s must still be 1.
  for (int size : {3, 7, 49, 98, 1000}) {
    std::vector<int32_t> sums = {size, 2 * size, size - 1, 0};
    ScaledCopy(sums.data(), sums.data(), 4, DataType::kInt32, 1.0 / size);
    EXPECT_EQ(sums, (std::vector<int32_t>{1, 2, 0, 0})) << size;
  }
}

// Every whole quotient of up to 4096 ranks stays whole, through the tolerance that allows for the
// rounded factor; and a large int64 whose quotient is a true fraction truncates, not snaps: the
// average of 1700000000000001 and ...002 is ...001.
TEST(ScaledCopyTest, IntegerAveragesSnapOnlyWithinRoundingError) {
  for (int64_t size = 1; size <= 4096; ++size) {
    std::vector<int64_t> sums;
    for (int64_t k : {int64_t{1}, int64_t{7}, int64_t{1000003}, int64_t{1} << 40}) {
      sums.push_back(k * size);
      sums.push_back(-k * size);
    }
    std::vector<int64_t> averaged(sums.size());
    ScaledCopy(sums.data(), averaged.data(), static_cast<int64_t>(sums.size()), DataType::kInt64,
               1.0 / static_cast<double>(size));
    for (size_t i = 0; i < sums.size(); ++i) ASSERT_EQ(averaged[i], sums[i] / size) << size;
  }
  std::vector<int64_t> large = {3400000000000003, -3400000000000003};
  ScaledCopy(large.data(), large.data(), 2, DataType::kInt64, 0.5);
  EXPECT_EQ(large, (std::vector<int64_t>{1700000000000001, -1700000000000001}));
  // A quarter of 4800000000000003 is ...000.75, within a double's epsilon of ...001; and past
  // 2^53, where a double does not hold every int64, a third of a multiple of 3.
  const int64_t big = (int64_t{1} << 60) + 1;
  std::vector<int64_t> sums = {4800000000000003, 3 * big, -3 * big};
  ScaledCopy(sums.data(), sums.data(), 1, DataType::kInt64, 0.25);
  ScaledCopy(sums.data() + 1, sums.data() + 1, 2, DataType::kInt64, 1.0 / 3);
  EXPECT_EQ(sums, (std::vector<int64_t>{1200000000000000, big, -big}));
  // A postscale folded into the average's factor (2 / 6) still divides exactly.
  std::vector<int64_t> folded = {6 * big};
  ScaledCopy(folded.data(), folded.data(), 1, DataType::kInt64, 2.0 * (1.0 / 6));
  EXPECT_EQ(folded[0], 2 * big);
}

// Combining any value with the identity under its op gives the value back, for every dtype.
// Input q holds small integers that differ per input, so every fold order would show; the expected
// value is computed in double from the decoded inputs.
void CheckCombine(DataType dtype, ReduceOp op, int num_inputs, int64_t count, double postscale) {
  SCOPED_TRACE(DataTypeName(dtype) + " " + ReduceOpName(op) + " inputs " +
               std::to_string(num_inputs) + " count " + std::to_string(count) + " postscale " +
               std::to_string(postscale));
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<const void*> pointers;
  for (int q = 0; q < num_inputs; ++q) {
    std::vector<double> values = SampleValues(dtype, count);
    for (int64_t i = 0; i < count; ++i) {
      // Products stay small: only a few elements are other than 1 or -1.
      if (op == ReduceOp::kProduct)
        values[i] = i % 5 == q ? 2.0 * (IsSigned(dtype) ? -1 : 1) : 1;
      else
        values[i] += q;
    }
    inputs.push_back(Encode(dtype, values));
  }
  for (const auto& in : inputs) pointers.push_back(in.data());
  std::vector<uint8_t> out((count + 1) * DataTypeSize(dtype), 0x5A);
  CombineInto(pointers.data(), num_inputs, out.data(), count, dtype, op, postscale);
  for (int64_t i = 0; i < count; ++i) {
    double folded = Decode(dtype, inputs[0], i);
    for (int q = 1; q < num_inputs; ++q) {
      const double v = Decode(dtype, inputs[q], i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage:
          folded += v;
          break;
        case ReduceOp::kProduct:
          folded *= v;
          break;
        case ReduceOp::kMin:
          folded = std::min(folded, v);
          break;
        case ReduceOp::kMax:
          folded = std::max(folded, v);
          break;
        case ReduceOp::kAdasum:  // no fold: CombineInto never gets it
          break;
      }
    }
    EXPECT_EQ(Decode(dtype, out, i), Expected(dtype, folded, postscale)) << "element " << i;
  }
  const size_t size = DataTypeSize(dtype);
  for (size_t b = count * size; b < (count + 1) * size; ++b) EXPECT_EQ(out[b], 0x5A);
}

TEST(CombineIntoTest, EveryDtypeOpInputCountAndLength) {
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProduct};
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : ops) {
      for (int num_inputs : {1, 2, 3, 4}) {
        for (int64_t count : {0, 1, 31, 32, 33, 100}) {
          const double postscale = op == ReduceOp::kAverage ? 0.5 : 1.0;
          CheckCombine(dtype, op, num_inputs, count, postscale);
        }
      }
    }
  }
}

TEST(CombineIntoTest, IntegerSumsWrapAround) {
  const int32_t big = std::numeric_limits<int32_t>::max();
  const int32_t one = 1;
  const void* inputs[] = {&big, &one};
  int32_t out = 0;
  CombineInto(inputs, 2, &out, 1, DataType::kInt32, ReduceOp::kSum, 1.0);
  EXPECT_EQ(out, std::numeric_limits<int32_t>::min());
}

TEST(CombineIntoTest, HalvesFoldInFloatAndRoundOnce) {
  // 2048 + 1 + 1 in float16: rounding after each addition would stay at 2048 (the spacing there
  // is 2); folding in float32 and rounding once gives 2050.
  const uint16_t a = FloatToHalf(2048.0f), b = FloatToHalf(1.0f), c = FloatToHalf(1.0f);
  const void* inputs[] = {&a, &b, &c};
  uint16_t out = 0;
  CombineInto(inputs, 3, &out, 1, DataType::kFloat16, ReduceOp::kSum, 1.0);
  EXPECT_EQ(HalfToFloat(out), 2050.0f);
}

TEST(CombineIntoTest, MinAndMaxPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    for (int nan_at : {0, 1}) {
      float values[2] = {1.0f, 2.0f};
      values[nan_at] = nan;
      const void* inputs[] = {&values[0], &values[1]};
      float out = 0;
      CombineInto(inputs, 2, &out, 1, DataType::kFloat32, op, 1.0);
      EXPECT_TRUE(std::isnan(out)) << ReduceOpName(op) << " NaN at " << nan_at;
    }
  }
}

TEST(CombineIntoTest, OutputMayBeTheFirstInput) {
  std::vector<float> a(100, 1.0f), b(100, 2.0f);
  const void* inputs[] = {a.data(), b.data()};
  CombineInto(inputs, 2, a.data(), 100, DataType::kFloat32, ReduceOp::kSum, 1.0);
  for (float v : a) EXPECT_EQ(v, 3.0f);
}

TEST(FillReductionIdentityTest, IdentityLeavesEveryValueUnchanged) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> bytes(16 * 3);
  FillReductionIdentity(bytes.data(), 3, DataType::kFloat32, ReduceOp::kMin);
  EXPECT_EQ(Load<float>(bytes, 2), inf);
  FillReductionIdentity(bytes.data(), 3, DataType::kFloat64, ReduceOp::kMax);
  EXPECT_EQ(Load<double>(bytes, 1), -std::numeric_limits<double>::infinity());
  FillReductionIdentity(bytes.data(), 3, DataType::kInt32, ReduceOp::kMin);
  EXPECT_EQ(Load<int32_t>(bytes, 0), std::numeric_limits<int32_t>::max());
  FillReductionIdentity(bytes.data(), 3, DataType::kInt8, ReduceOp::kMax);
  EXPECT_EQ(Load<int8_t>(bytes, 2), std::numeric_limits<int8_t>::lowest());
  FillReductionIdentity(bytes.data(), 3, DataType::kUInt8, ReduceOp::kMax);
  EXPECT_EQ(Load<uint8_t>(bytes, 2), 0);
  FillReductionIdentity(bytes.data(), 3, DataType::kInt64, ReduceOp::kProduct);
  EXPECT_EQ(Load<int64_t>(bytes, 2), 1);
  FillReductionIdentity(bytes.data(), 3, DataType::kFloat16, ReduceOp::kMin);
  EXPECT_EQ(HalfToFloat(Load<uint16_t>(bytes, 2)), inf);
  FillReductionIdentity(bytes.data(), 3, DataType::kBFloat16, ReduceOp::kMax);
  EXPECT_EQ(BFloat16ToFloat(Load<uint16_t>(bytes, 2)), -inf);
  FillReductionIdentity(bytes.data(), 3, DataType::kBFloat16, ReduceOp::kProduct);
  EXPECT_EQ(BFloat16ToFloat(Load<uint16_t>(bytes, 0)), 1.0f);
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::fill(bytes.begin(), bytes.end(), 0xAB);
      FillReductionIdentity(bytes.data(), 3, dtype, op);
      for (size_t i = 0; i < 3 * DataTypeSize(dtype); ++i) EXPECT_EQ(bytes[i], 0) << i;
      EXPECT_EQ(bytes[3 * DataTypeSize(dtype)], 0xAB) << "wrote past the count";
    }
  }
}

}  // namespace
}  // namespace gradsync
