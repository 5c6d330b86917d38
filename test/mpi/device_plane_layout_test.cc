// Where the device plane reduces a bucket over the host backend, at 1, 2 and 4 ranks: an
// unscaled tensor alone straight into its output, tensors lying back to back reduced where they
// lie, ranks whose buckets lie differently reducing the same elements, and outputs overlapping
// their inputs copied (the general cases: device_plane_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "test/mpi/device_plane_fixture.h"

namespace gradsync {
namespace testing {
namespace {

// Unscaled, a tensor reduced alone into another buffer goes straight to the collective: no copy
// is launched, and the input is left as it was. A sum, and an average (scaled after the
// collective, in the output, where there is more than one rank).
TEST_F(DevicePlaneTest, AnUnscaledTensorAloneIsReducedOutOfPlaceWithoutACopy) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    Op a("a", DataType::kFloat32, {1000});
    Fill(&a.input, op, rank_);
    a.OutOfPlace();
    plane_->RecordPhases(true);
    ASSERT_TRUE(plane_->Allreduce({&a.entry}, {DataType::kFloat32, op}).ok());
    ASSERT_TRUE(Finish().ok());
    std::vector<std::string> phases;
    for (const DataPlane::TimedPhase& phase : plane_->TakePhases()) phases.push_back(phase.label);
    plane_->RecordPhases(false);
    std::vector<std::string> expected{"DEVICE_QUEUE", "DEVICE_ALLREDUCE"};
    if (op == ReduceOp::kAverage && size_ > 1) expected.push_back("DEVICE_SCALE");
    EXPECT_EQ(phases, expected) << ReduceOpName(op);
    EXPECT_TRUE(Reduced(a.result, op, DataType::kFloat32, size_)) << ReduceOpName(op);
    for (int64_t i = 0; i < a.input.size(); ++i) {
      ASSERT_EQ(a.input.Get(i), Value(op, rank_, i)) << ReduceOpName(op) << " input " << i;
    }
  }
}

// Tensors as views into one buffer: tensor k's element i at `first[k] + i`, or, where `apart`,
// each in a buffer of its own. Outputs in `outputs` (at the same places) when `out_of_place`.
class Views {
 public:
  Views(DataType dtype, const std::vector<int64_t>& counts, const std::vector<int64_t>& first,
        bool apart, bool out_of_place)
      : dtype_(dtype), counts_(counts), first_(first), entries_(counts.size()) {
    int64_t elements = 0;
    for (size_t k = 0; k < counts.size(); ++k) elements = std::max(elements, first[k] + counts[k]);
    for (int copy = 0; copy < 2; ++copy) {
      if (apart) {
        for (int64_t n : counts)
          buffers_[copy].push_back(std::make_unique<HostTensor>(dtype, std::vector<int64_t>{n}));
      } else {
        buffers_[copy].push_back(
            std::make_unique<HostTensor>(dtype, std::vector<int64_t>{elements}));
      }
    }
    for (size_t k = 0; k < counts.size(); ++k) {
      entries_[k].name = "view." + std::to_string(k);
      entries_[k].input = View(0, k);
      entries_[k].output = out_of_place ? View(1, k) : entries_[k].input;
      entries_[k].state = std::make_shared<OpState>();
      pointers_.push_back(&entries_[k]);
    }
    out_of_place_ = out_of_place;
  }
  const std::vector<TensorEntry*>& entries() const { return pointers_; }
  // Elements of a shared buffer outside every tensor hold kUntouched, before and after.
  void Fill(ReduceOp op, int rank) {
    for (auto& buffers : buffers_) {
      for (auto& buffer : buffers) {
        for (int64_t i = 0; i < buffer->size(); ++i) buffer->Set(i, kUntouched);
      }
    }
    for (size_t k = 0; k < counts_.size(); ++k) {
      for (int64_t i = 0; i < counts_[k]; ++i) Input(k)->Set(Index(k, i), Value(op, rank, i));
    }
  }
  ::testing::AssertionResult Reduced(ReduceOp op, int size, double scale) {
    for (size_t k = 0; k < counts_.size(); ++k) {
      const HostTensor* out = out_of_place_ ? Buffer(1, k) : Input(k);
      for (int64_t i = 0; i < counts_[k]; ++i) {
        const double expected = Expected(op, dtype_, size, i) * scale;
        const double got = out->Get(Index(k, i));
        if (std::abs(got - expected) > Tolerance(dtype_, expected)) {
          return ::testing::AssertionFailure()
                 << "tensor " << k << " element " << i << ": " << got << ", wanted " << expected;
        }
      }
    }
    if (buffers_[0].size() > 1) return ::testing::AssertionSuccess();
    for (int copy = 0; copy < 2; ++copy) {
      for (int64_t i = 0; i < buffers_[copy][0]->size(); ++i) {
        if (!InAnyTensor(i) && buffers_[copy][0]->Get(i) != kUntouched) {
          return ::testing::AssertionFailure()
                 << "element " << i << " of buffer " << copy << ", in no tensor, was written";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  static constexpr double kUntouched = -7;

  bool InAnyTensor(int64_t i) const {
    for (size_t k = 0; k < counts_.size(); ++k) {
      if (i >= first_[k] && i < first_[k] + counts_[k]) return true;
    }
    return false;
  }
  HostTensor* Buffer(int copy, size_t k) const {
    return buffers_[copy].size() == 1 ? buffers_[copy][0].get() : buffers_[copy][k].get();
  }
  HostTensor* Input(size_t k) const { return Buffer(0, k); }
  int64_t Index(size_t k, int64_t i) const { return buffers_[0].size() == 1 ? first_[k] + i : i; }
  TensorView View(int copy, size_t k) const {
    TensorView whole = Buffer(copy, k)->view();
    const int64_t at = Index(k, 0);
    whole.data = static_cast<char*>(whole.data) + at * static_cast<int64_t>(DataTypeSize(dtype_));
    whole.shape = {counts_[k]};
    return whole;
  }

  DataType dtype_;
  std::vector<int64_t> counts_;
  std::vector<int64_t> first_;
  std::vector<TensorEntry> entries_;
  std::vector<TensorEntry*> pointers_;
  std::vector<std::unique_ptr<HostTensor>> buffers_[2];
  bool out_of_place_ = false;
};

// A bucket whose tensors lie back to back in bucket order, each a whole number of 16 bytes but
// the last (a flat gradient buffer's views), is reduced where it lies: no copy unless a scale
// needs one, in place or into outputs that lie the same way.
TEST_F(DevicePlaneTest, TensorsBackToBackAreReducedWhereTheyLie) {
  const std::vector<int64_t> counts{16, 0, 48, 7};
  const std::vector<int64_t> first{0, 16, 16, 64};
  for (DataType dtype :
       {DataType::kFloat32, DataType::kFloat16, DataType::kInt8, DataType::kFloat64}) {
    for (bool out_of_place : {false, true}) {
      for (const ReduceSpec& spec :
           {ReduceSpec{dtype, ReduceOp::kSum}, ReduceSpec{dtype, ReduceOp::kAverage},
            ReduceSpec{dtype, ReduceOp::kMax, 2.0, 0.5}}) {
        Views views(dtype, counts, first, /*apart=*/false, out_of_place);
        views.Fill(spec.op, rank_);
        plane_->RecordPhases(true);
        ASSERT_TRUE(plane_->Allreduce(views.entries(), spec).ok());
        ASSERT_TRUE(Finish().ok());
        std::vector<std::string> expected{"DEVICE_QUEUE"};
        if (spec.prescale != 1.0) expected.push_back("DEVICE_COPY_IN");
        expected.push_back("DEVICE_ALLREDUCE");
        if (spec.postscale != 1.0 || (spec.op == ReduceOp::kAverage && size_ > 1)) {
          expected.push_back("DEVICE_SCALE");
        }
        const std::string what = std::string(DataTypeName(dtype)) + " " + ReduceOpName(spec.op) +
                                 (out_of_place ? " out of place" : "");
        EXPECT_EQ(Labels(plane_->TakePhases()), expected) << what;
        plane_->RecordPhases(false);
        EXPECT_TRUE(views.Reduced(spec.op, size_, 1.0)) << what;
      }
    }
  }
}

// Whether a rank reduces its bucket where it lies is its own choice: each layout puts every
// element at the same offset of the collective. Even ranks hold views into one buffer, odd ranks
// tensors of their own; sizes that are 16-byte multiples but not 64-byte ones (the host plane's
// fusion alignment), and buckets whose first tensor leaves a gap, which every rank copies: even
// where the views leave the same gap, which is no tensor's to write.
TEST_F(DevicePlaneTest, RanksThatLayOutTheirTensorsDifferentlyReduceTheSameElements) {
  struct Case {
    std::vector<int64_t> counts;
    std::vector<int64_t> first;
    bool in_place_when_together;
  };
  const std::vector<Case> cases = {
      {{4, 8, 12, 3}, {0, 4, 12, 24}, true},
      {{3, 8, 4}, {0, 3, 11}, false},
      {{3, 8, 4}, {0, 4, 12}, false},
  };
  for (const Case& c : cases) {
    const bool apart = rank_ % 2 == 1;
    Views views(DataType::kFloat32, c.counts, c.first, apart, /*out_of_place=*/false);
    views.Fill(ReduceOp::kSum, rank_);
    plane_->RecordPhases(true);
    ASSERT_TRUE(plane_->Allreduce(views.entries(), {DataType::kFloat32, ReduceOp::kSum}).ok());
    ASSERT_TRUE(Finish().ok());
    const std::vector<std::string> labels = Labels(plane_->TakePhases());
    plane_->RecordPhases(false);
    const bool copied = labels.size() > 1 && labels[1] == "DEVICE_COPY_IN";
    EXPECT_EQ(copied, apart || !c.in_place_when_together) << c.counts.size() << " tensors";
    EXPECT_TRUE(views.Reduced(ReduceOp::kSum, size_, 1.0)) << c.counts.size() << " tensors";
  }
}

// Outputs that overlap the inputs at another offset cannot be reduced by one collective from the
// one range into the other: they are copied in and out, and come out right.
TEST_F(DevicePlaneTest, OutputsOverlappingTheirInputsAreCopied) {
  HostTensor memory(DataType::kFloat32, {40});
  std::vector<TensorEntry> entries(2);
  std::vector<TensorEntry*> bucket;
  for (int k = 0; k < 2; ++k) {
    TensorView input = memory.view();
    input.data = static_cast<float*>(memory.data()) + 16 * k;
    input.shape = {16};
    entries[k].input = input;
    entries[k].output = input;
    entries[k].output.data = static_cast<float*>(input.data) + 4;
    entries[k].state = std::make_shared<OpState>();
    bucket.push_back(&entries[k]);
  }
  // Tensor 0 reads elements 0-15 and writes 4-19; tensor 1 reads 16-31 and writes 20-35.
  for (int64_t i = 0; i < 32; ++i) memory.Set(i, Value(ReduceOp::kSum, rank_, i % 16));
  plane_->RecordPhases(true);
  ASSERT_TRUE(plane_->Allreduce(bucket, {DataType::kFloat32, ReduceOp::kSum}).ok());
  ASSERT_TRUE(Finish().ok());
  EXPECT_EQ(Labels(plane_->TakePhases())[1], "DEVICE_COPY_IN");
  plane_->RecordPhases(false);
  for (int64_t i = 4; i < 36; ++i) {
    const double expected = Expected(ReduceOp::kSum, DataType::kFloat32, size_, (i - 4) % 16);
    ASSERT_EQ(memory.Get(i), expected) << "element " << i;
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
