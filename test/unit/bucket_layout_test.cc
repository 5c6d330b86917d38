#include "ops/device/bucket_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace gradsync {
namespace {

// Entries of float32 tensors with the given element counts, each a view at `offsets[i]` floats
// into `memory` (and its output at the same place in `outputs` when that is given).
class Bucket {
 public:
  Bucket(const std::vector<int64_t>& counts, const std::vector<int64_t>& offsets, float* memory,
         float* outputs = nullptr)
      : entries_(counts.size()) {
    for (size_t i = 0; i < counts.size(); ++i) {
      float* in = memory + offsets[i];
      entries_[i].input = TensorView(in, DataType::kFloat32, {counts[i]}, Device::Cuda(0));
      entries_[i].output = entries_[i].input;
      if (outputs != nullptr) entries_[i].output.data = outputs + offsets[i];
      pointers_.push_back(&entries_[i]);
    }
  }
  const std::vector<TensorEntry*>& entries() const { return pointers_; }
  BucketLayout Layout() const {
    BucketLayout layout;
    EXPECT_TRUE(LayOutBucket(pointers_, sizeof(float), &layout).ok());
    return layout;
  }

 private:
  std::vector<TensorEntry> entries_;
  std::vector<TensorEntry*> pointers_;
};

TEST(BucketLayoutTest, PacksEachTensorOnASixteenByteBoundaryAndEndsWithTheLast) {
  std::vector<float> memory(100);
  const BucketLayout layout = Bucket({3, 0, 8, 5}, {0, 0, 0, 0}, memory.data()).Layout();
  EXPECT_EQ(layout.offsets, (std::vector<size_t>{0, 12, 16, 48}));
  EXPECT_EQ(layout.bytes, 68u);
  EXPECT_FALSE(layout.packed);  // the first tensor leaves 4 bytes before the next boundary
}

TEST(BucketLayoutTest, TensorsOfWholeAlignmentUnitsAreBackToBack) {
  std::vector<float> memory(100);
  const BucketLayout layout = Bucket({4, 0, 8, 5}, {0, 0, 0, 0}, memory.data()).Layout();
  EXPECT_EQ(layout.offsets, (std::vector<size_t>{0, 16, 16, 48}));
  EXPECT_EQ(layout.bytes, 68u);
  EXPECT_TRUE(layout.packed);  // the last tensor's size does not matter
}

TEST(BucketLayoutTest, TensorsBackToBackInBucketOrderAreFoundInPlace) {
  std::vector<float> memory(100);
  const Bucket bucket({4, 8, 5}, {20, 24, 32}, memory.data());
  const void* input = nullptr;
  void* output = nullptr;
  ASSERT_TRUE(FindBucketInPlace(bucket.entries(), bucket.Layout(), &input, &output));
  EXPECT_EQ(input, memory.data() + 20);
  EXPECT_EQ(output, memory.data() + 20);
}

TEST(BucketLayoutTest, OutputsBackToBackElsewhereAreFoundToo) {
  std::vector<float> memory(100);
  std::vector<float> outputs(100);
  const Bucket bucket({4, 8, 5}, {20, 24, 32}, memory.data(), outputs.data());
  const void* input = nullptr;
  void* output = nullptr;
  ASSERT_TRUE(FindBucketInPlace(bucket.entries(), bucket.Layout(), &input, &output));
  EXPECT_EQ(input, memory.data() + 20);
  EXPECT_EQ(output, outputs.data() + 20);
}

TEST(BucketLayoutTest, EmptyTensorsMaySitAnywhere) {
  std::vector<float> memory(100);
  const Bucket bucket({0, 4, 0, 8, 0}, {90, 20, 3, 24, 0}, memory.data());
  const void* input = nullptr;
  void* output = nullptr;
  ASSERT_TRUE(FindBucketInPlace(bucket.entries(), bucket.Layout(), &input, &output));
  EXPECT_EQ(input, memory.data() + 20);
}

// Each of these would put some element at another offset of the collective than the fusion
// buffer does on a rank that copies, or reduce bytes that belong to no tensor of the bucket.
TEST(BucketLayoutTest, AnyOtherArrangementIsCopied) {
  std::vector<float> memory(100);
  std::vector<float> outputs(100);
  struct Case {
    const char* what;
    std::vector<int64_t> counts;
    std::vector<int64_t> offsets;
    float* outputs;
  };
  const std::vector<Case> cases = {
      {"a gap between tensors", {4, 8}, {0, 5}, nullptr},
      {"memory order against bucket order", {4, 4}, {4, 0}, nullptr},
      {"overlapping tensors", {4, 8}, {0, 2}, nullptr},
      {"back to back but not on a boundary: a gap in the bucket", {3, 8}, {0, 3}, nullptr},
      {"the bucket's own gap, which is no tensor's to reduce", {3, 8}, {0, 4}, nullptr},
      {"an empty bucket", {0, 0}, {0, 0}, nullptr},
  };
  for (const Case& c : cases) {
    const Bucket bucket(c.counts, c.offsets, memory.data(), c.outputs);
    const void* input = nullptr;
    void* output = nullptr;
    EXPECT_FALSE(FindBucketInPlace(bucket.entries(), bucket.Layout(), &input, &output)) << c.what;
  }
}

TEST(BucketLayoutTest, OutputsOverlappingTheInputsElsewhereAreCopied) {
  std::vector<float> memory(100);
  Bucket shifted({4, 8}, {0, 4}, memory.data(), memory.data() + 1);
  const void* input = nullptr;
  void* output = nullptr;
  EXPECT_FALSE(FindBucketInPlace(shifted.entries(), shifted.Layout(), &input, &output));
  // Right after the inputs is fine.
  Bucket after({4, 8}, {0, 4}, memory.data(), memory.data() + 12);
  EXPECT_TRUE(FindBucketInPlace(after.entries(), after.Layout(), &input, &output));
}

TEST(BucketLayoutTest, OneOutputOutOfLineIsCopied) {
  std::vector<float> memory(100);
  std::vector<float> elsewhere(8);
  Bucket bucket({4, 8}, {0, 4}, memory.data());
  bucket.entries()[1]->output.data = elsewhere.data();
  const void* input = nullptr;
  void* output = nullptr;
  EXPECT_FALSE(FindBucketInPlace(bucket.entries(), bucket.Layout(), &input, &output));
}

TEST(BucketLayoutTest, ASizeBeyondTheAddressSpaceIsRefused) {
  TensorEntry half;  // 2^63 bytes: two of them do not fit
  half.input = TensorView(nullptr, DataType::kFloat64, {int64_t{1} << 60}, Device::Cuda(0));
  TensorEntry whole;  // 2^65 bytes
  whole.input = TensorView(nullptr, DataType::kFloat64, {int64_t{1} << 62}, Device::Cuda(0));
  BucketLayout layout;
  EXPECT_TRUE(LayOutBucket({&half}, 8, &layout).ok());
  EXPECT_FALSE(LayOutBucket({&half, &half}, 8, &layout).ok());
  EXPECT_FALSE(LayOutBucket({&whole}, 8, &layout).ok());
}

}  // namespace
}  // namespace gradsync
