// op=Adasum on device tensors, through the whole path (the API, negotiation and the locked
// schedule, the device plane, the finalizer) with the device plane's backend on the host
// (AdasumTest's MakeHostBackedDevicePlane: host memory labelled cuda:0). The device plane packs an
// Adasum bucket as the MPI plane packs it, so device tensors must get the very bytes host tensors
// get, besides matching the tree. Part of adasum_test (1, 2 and 4 ranks).
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test/mpi/adasum_reference.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

// Tensors of `sizes` elements holding Input(rank, seed + t, ...), combined by Adasum with
// `options`' scales, on the host or the device: as one group, or each alone and waited for before
// the next (so that no bucket holds two). Returns the results.
std::vector<std::unique_ptr<HostTensor>> Combined(int rank, DataType dtype,
                                                  const std::vector<int64_t>& sizes, int seed,
                                                  bool grouped, bool device,
                                                  const AllreduceOptions& options) {
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<TensorView> views;
  std::vector<std::string> names;
  for (size_t t = 0; t < sizes.size(); ++t) {
    tensors.push_back(std::make_unique<HostTensor>(dtype, std::vector<int64_t>{sizes[t]}));
    for (int64_t i = 0; i < sizes[t]; ++i) {
      tensors.back()->Set(i, Input(rank, seed + static_cast<int>(t), i));
    }
    views.push_back(Placed(tensors.back()->view(), device));
    names.push_back("adasum." + std::string(device ? "device." : "host.") + DataTypeName(dtype) +
                    "." + std::to_string(seed) + (grouped ? ".group." : ".alone.") +
                    std::to_string(t));
  }
  if (grouped) {
    GroupedAllreduceOptions group;
    group.op = ReduceOp::kAdasum;
    group.prescale = options.prescale;
    group.postscale = options.postscale;
    group.names = names;
    for (const Handle& h : grouped_allreduce(views, group)) EXPECT_TRUE(Succeeds(h));
  } else {
    for (size_t t = 0; t < views.size(); ++t) {
      AllreduceOptions alone = options;
      alone.op = ReduceOp::kAdasum;
      alone.name = names[t];
      EXPECT_TRUE(Succeeds(allreduce(views[t], alone)));
    }
  }
  return tensors;
}

::testing::AssertionResult SameBytes(HostTensor* a, HostTensor* b, size_t element_size) {
  if (a->size() != b->size()) return ::testing::AssertionFailure() << "sizes differ";
  const size_t bytes = static_cast<size_t>(a->size()) * element_size;
  if (bytes == 0 || std::memcmp(a->data(), b->data(), bytes) == 0) {
    return ::testing::AssertionSuccess();
  }
  for (int64_t i = 0; i < a->size(); ++i) {
    if (std::memcmp(static_cast<char*>(a->data()) + i * element_size,
                    static_cast<char*>(b->data()) + i * element_size, element_size) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a->Get(i) << " against " << b->Get(i);
    }
  }
  return ::testing::AssertionFailure() << "bytes differ";
}

// Sizes that put the tensors off the device layout's 16-byte boundaries, and an empty one.
const std::vector<int64_t> kSizes{1, 7, 1000, 0, 33, 4099};

TEST_F(AdasumTest, DeviceTensorsGetTheHostsBytesInEveryFloatingDtype) {
  for (DataType dtype :
       {DataType::kFloat64, DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    for (bool grouped : {true, false}) {
      AllreduceOptions options;
      // Half precision is scaled in float32: a prescale past float16's range, undone afterwards.
      options.prescale = dtype == DataType::kFloat16 ? 1e5 : 2.0;
      options.postscale = dtype == DataType::kFloat16 ? 1e-5 : 0.25;
      auto host = Combined(rank_, dtype, kSizes, 0, grouped, false, options);
      auto device = Combined(rank_, dtype, kSizes, 0, grouped, true, options);
      for (size_t t = 0; t < kSizes.size(); ++t) {
        ASSERT_TRUE(SameBytes(device[t].get(), host[t].get(), DataTypeSize(dtype)))
            << DataTypeName(dtype) << (grouped ? " grouped" : " alone") << ", tensor " << t;
        const Vector want = Reference(size_, static_cast<int>(t), kSizes[t], options.prescale);
        for (int64_t i = 0; i < kSizes[t]; ++i) {
          const double expected = options.postscale * want[i];
          ASSERT_NEAR(device[t]->Get(i), expected, Allowed(dtype) * (1 + std::fabs(expected)))
              << DataTypeName(dtype) << ", tensor " << t << ", element " << i;
        }
        EXPECT_TRUE(SameOnEveryRank(device[t].get(), DataTypeSize(dtype)));
      }
    }
  }
}

// Gradients as views into one allocation, back to back (bucket views): combined where they lie,
// with the same bytes as separate host tensors in one group.
TEST_F(AdasumTest, ViewsBackToBackAreCombinedWhereTheyLie) {
  const std::vector<int64_t> sizes{16, 1000, 4, 64};  // whole 16-byte units: a packed layout
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  auto host = Combined(rank_, DataType::kFloat32, sizes, 5, true, false, AllreduceOptions());
  HostTensor flat(DataType::kFloat32, {total});
  std::vector<TensorView> views;
  GroupedAllreduceOptions group;
  group.op = ReduceOp::kAdasum;
  int64_t at = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i) flat.Set(at + i, Input(rank_, 5 + t, i));
    views.push_back(TensorView(static_cast<float*>(flat.data()) + at, DataType::kFloat32,
                               {sizes[t]}, Device::Cuda(0)));
    group.names.push_back("adasum.views." + std::to_string(t));
    at += sizes[t];
  }
  for (const Handle& h : grouped_allreduce(views, group)) ASSERT_TRUE(Succeeds(h));
  at = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    EXPECT_EQ(std::memcmp(static_cast<float*>(flat.data()) + at, host[t]->data(),
                          static_cast<size_t>(sizes[t]) * sizeof(float)),
              0)
        << "tensor " << t;
    at += sizes[t];
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
