// The device batched copy's work split and element code, run by the host executor: every element
// of every segment lands once, with the bits the host kernels give it, whatever the sizes, the
// alignment, the lane count and the scale.
#include "ops/device/batched_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/scale.h"

namespace gradsync {
namespace {

const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt32,
                              DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16,
                              DataType::kFloat32, DataType::kFloat64};

constexpr uint8_t kGuard = 0xA5;
constexpr size_t kGuardBytes = 64;

// Random bytes that are finite values of `dtype`, so scaling never meets NaN payloads whose bits
// the hardware may canonicalize differently.
std::vector<uint8_t> RandomValues(DataType dtype, int64_t count, std::mt19937* rng) {
  const size_t size = DataTypeSize(dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * size);
  std::uniform_real_distribution<double> real(-1000.0, 1000.0);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* at = bytes.data() + static_cast<size_t>(i) * size;
    const double v = real(*rng);
    if (dtype == DataType::kFloat32) {
      const float f = static_cast<float>(v);
      std::memcpy(at, &f, size);
    } else if (dtype == DataType::kFloat64) {
      std::memcpy(at, &v, size);
    } else if (dtype == DataType::kFloat16) {
      const uint16_t h = FloatToHalf(static_cast<float>(v) / 32.0f);
      std::memcpy(at, &h, size);
    } else if (dtype == DataType::kBFloat16) {
      const uint16_t b = FloatToBFloat16(static_cast<float>(v));
      std::memcpy(at, &b, size);
    } else {
      for (size_t k = 0; k < size; ++k) at[k] = static_cast<uint8_t>(byte(*rng));
    }
  }
  return bytes;
}

// One segment's memory: a source, a destination and the expected destination, each offset from a
// 64-byte boundary by a given number of bytes and followed by guard bytes.
struct Case {
  std::vector<uint8_t> src_storage, dst_storage, expected;
  size_t src_offset, dst_offset;
  CopySegment segment;
};

Case MakeCase(DataType dtype, int64_t count, size_t src_offset, size_t dst_offset, double scale,
              bool in_place, std::mt19937* rng) {
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  Case c;
  c.src_offset = src_offset;
  c.dst_offset = in_place ? src_offset : dst_offset;
  const std::vector<uint8_t> values = RandomValues(dtype, count, rng);
  c.src_storage.assign(bytes + 2 * kGuardBytes + 64, kGuard);
  c.dst_storage.assign(bytes + 2 * kGuardBytes + 64, kGuard);
  auto aligned = [](std::vector<uint8_t>& v) {
    const auto address = reinterpret_cast<uintptr_t>(v.data() + kGuardBytes);
    return v.data() + kGuardBytes + (64 - address % 64) % 64;
  };
  uint8_t* src = aligned(c.src_storage) + c.src_offset;
  uint8_t* dst = in_place ? src : aligned(c.dst_storage) + c.dst_offset;
  if (bytes > 0) std::memcpy(src, values.data(), bytes);
  c.expected.resize(bytes);
  ScaledCopy(values.data(), c.expected.data(), count, dtype, scale);
  c.segment = {src, dst, count, scale};
  return c;
}

void ExpectCopied(const Case& c, DataType dtype, const std::string& what) {
  const size_t bytes = static_cast<size_t>(c.segment.count) * DataTypeSize(dtype);
  const auto* dst = static_cast<const uint8_t*>(c.segment.dst);
  ASSERT_EQ(0, bytes == 0 ? 0 : std::memcmp(dst, c.expected.data(), bytes)) << what;
  // Nothing before or after the destination was touched.
  for (size_t k = 1; k <= 16; ++k) EXPECT_EQ(kGuard, dst[-static_cast<ptrdiff_t>(k)]) << what;
  for (size_t k = 0; k < 16; ++k) EXPECT_EQ(kGuard, dst[bytes + k]) << what;
}

TEST(BatchedCopyTest, PlanGivesEveryChunkToTheSegmentThatOwnsIt) {
  const size_t size = 4;
  const int64_t per = ChunkElements(size);
  std::vector<CopySegment> segments;
  for (int64_t count :
       {int64_t{0}, int64_t{1}, per - 1, int64_t{0}, per, per + 1, 3 * per, int64_t{0}}) {
    segments.push_back({nullptr, nullptr, count, 1.0});
  }
  const int n = static_cast<int>(segments.size());
  const std::vector<int64_t> first = PlanCopyChunks(segments.data(), n, size);
  EXPECT_EQ((std::vector<int64_t>{0, 0, 1, 2, 2, 3, 5, 8, 8}), first);
  for (int64_t chunk = 0; chunk < first.back(); ++chunk) {
    const int s = SegmentOfChunk(first.data(), n, chunk);
    EXPECT_LE(first[s], chunk);
    EXPECT_LT(chunk, first[s + 1]) << "chunk " << chunk << " given to segment " << s;
    EXPECT_GT(segments[s].count, 0);
  }
  EXPECT_EQ((std::vector<int64_t>{0}), PlanCopyChunks(nullptr, 0, size));
}

TEST(BatchedCopyTest, EveryTypeSizeAlignmentLaneCountAndScale) {
  std::mt19937 rng(7);
  for (DataType dtype : kAllTypes) {
    const size_t size = DataTypeSize(dtype);
    const int64_t per = ChunkElements(size);
    for (double scale : {1.0, 0.5, 1.0 / 3.0, -3.0}) {
      for (int lanes : {1, 7, 256}) {
        // Offsets in bytes: aligned, element-aligned but not 16-byte aligned, and source and
        // destination misaligned differently (element-wise path).
        for (auto offsets : {std::pair<size_t, size_t>{0, 0}, {size, size}, {0, size}}) {
          std::vector<Case> cases;
          for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{33}, per - 1, per,
                                per + 1, 2 * per + 3}) {
            cases.push_back(
                MakeCase(dtype, count, offsets.first, offsets.second, scale, false, &rng));
          }
          std::vector<CopySegment> segments;
          for (const Case& c : cases) segments.push_back(c.segment);
          ASSERT_TRUE(RunBatchedCopyOnHost(segments, dtype, lanes).ok());
          for (const Case& c : cases) {
            ExpectCopied(c, dtype,
                         DataTypeName(dtype) + " count " + std::to_string(c.segment.count) +
                             " scale " + std::to_string(scale) + " lanes " + std::to_string(lanes) +
                             " offsets " + std::to_string(offsets.first) + "/" +
                             std::to_string(offsets.second));
          }
        }
      }
    }
  }
}

// Scaling in place by a factor that is not idempotent shows an element visited twice.
TEST(BatchedCopyTest, InPlaceScalingVisitsEachElementOnce) {
  std::mt19937 rng(11);
  for (DataType dtype : kAllTypes) {
    const int64_t per = ChunkElements(DataTypeSize(dtype));
    std::vector<Case> cases;
    for (int64_t count : {int64_t{1}, int64_t{17}, per + 9, 3 * per}) {
      cases.push_back(MakeCase(dtype, count, 0, 0, -3.0, true, &rng));
    }
    std::vector<CopySegment> segments;
    for (const Case& c : cases) segments.push_back(c.segment);
    ASSERT_TRUE(RunBatchedCopyOnHost(segments, dtype, 32).ok());
    for (const Case& c : cases) ExpectCopied(c, dtype, DataTypeName(dtype) + " in place");
  }
}

TEST(BatchedCopyTest, NothingToCopyAndBadArguments) {
  EXPECT_TRUE(RunBatchedCopyOnHost({}, DataType::kFloat32, 1).ok());
  EXPECT_TRUE(RunBatchedCopyOnHost({{nullptr, nullptr, 0, 2.0}}, DataType::kFloat32, 1).ok());
  EXPECT_FALSE(RunBatchedCopyOnHost({}, DataType::kFloat32, 0).ok());
  EXPECT_FALSE(RunBatchedCopyOnHost({}, static_cast<DataType>(99), 1).ok());
}

}  // namespace
}  // namespace gradsync
