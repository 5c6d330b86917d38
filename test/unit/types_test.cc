// TensorView's element and byte counts: the one definition of a valid shape that every enqueue
// uses.
#include <gtest/gtest.h>

#include <limits>

#include "gradsync/types.h"

namespace gradsync {
namespace {

constexpr int64_t kBig = int64_t{1} << 40;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

int64_t Elements(std::vector<int64_t> shape) {
  return TensorView(nullptr, DataType::kFloat32, std::move(shape)).num_elements();
}
int64_t BytesOf(std::vector<int64_t> shape, DataType dtype = DataType::kFloat32) {
  return TensorView(nullptr, dtype, std::move(shape)).num_bytes();
}

TEST(TensorViewTest, CountsOfOrdinaryShapes) {
  EXPECT_EQ(Elements({}), 1);
  EXPECT_EQ(BytesOf({}), 4);
  EXPECT_EQ(Elements({3, 5}), 15);
  EXPECT_EQ(BytesOf({3, 5}, DataType::kFloat64), 120);
  EXPECT_EQ(Elements({4, 0, 7}), 0);
  EXPECT_EQ(BytesOf({4, 0, 7}), 0);
}

TEST(TensorViewTest, NegativeDimensionIsInvalid) {
  EXPECT_EQ(Elements({2, -1}), -1);
  EXPECT_EQ(BytesOf({0, -1}), -1);
}

// Whether a shape is valid must not depend on the order of its dimensions, and an empty tensor is
// invalid when its other dimensions overflow: allgather rows and reducescatter shares are sized
// from them.
TEST(TensorViewTest, OverflowOfTheNonZeroDimensionsIsInvalidWhateverTheOrder) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{0, kBig, kBig}, std::vector<int64_t>{kBig, 0, kBig},
        std::vector<int64_t>{kBig, kBig, 0}}) {
    EXPECT_EQ(Elements(shape), -1) << ShapeString(shape);
    EXPECT_EQ(BytesOf(shape), -1) << ShapeString(shape);
  }
  EXPECT_EQ(Elements({kMax, 0}), 0);
  EXPECT_EQ(BytesOf({kMax, 0}, DataType::kUInt8), 0);
  // The elements fit but their bytes do not.
  EXPECT_EQ(Elements({kMax / 2, 0}), 0);
  EXPECT_EQ(BytesOf({kMax / 2, 0}), -1);
  EXPECT_EQ(BytesOf({0, kMax / 2}), -1);
}

TEST(TensorViewTest, UnknownDtypeHasNoByteCount) {
  EXPECT_EQ(BytesOf({3}, static_cast<DataType>(42)), -1);
  EXPECT_EQ(BytesOf({0}, static_cast<DataType>(42)), -1);
}

}  // namespace
}  // namespace gradsync
