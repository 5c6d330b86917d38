// adasum_test's fixture, and what op=Adasum must give, for its cases on host tensors and on device
// tensors: every rank's inputs combined up Adasum's tree in double precision, and a check that
// every rank holds the same bytes.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gradsync/types.h"
#include "ops/device/device_plane_factory.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {

// adasum_test's cases: host tensors, and device tensors (host memory labelled cuda:0) through a
// device plane whose backend is the host's (MakeHostBackedDevicePlane).
class AdasumTest : public MultiRankTest {
 protected:
  void SetUp() override {
    SetDevicePlaneFactoryForTesting(&MakeHostBackedDevicePlane);
    MultiRankTest::SetUp();
  }
  void TearDown() override {
    MultiRankTest::TearDown();
    SetDevicePlaneFactoryForTesting(nullptr);
  }
};

// `view`, relabelled as a device tensor where `device`.
inline TensorView Placed(TensorView view, bool device) {
  if (device) view.device = Device::Cuda(0);
  return view;
}

using Vector = std::vector<double>;

// Rank `rank`'s element `i` of tensor `t`: varied signs and sizes, so that ranks agree in part.
inline double Input(int rank, int t, int64_t i) {
  return std::sin(0.37 * static_cast<double>(i + 1) * (t + 1)) + 0.25 * rank * std::cos(1.3 * i);
}

// Adasum of two vectors of one tensor.
inline Vector Combine(const Vector& a, const Vector& b) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    dot += a[k] * b[k];
    aa += a[k] * a[k];
    bb += b[k] * b[k];
  }
  const double ca = aa > 0 ? 1 - dot / (2 * aa) : 1, cb = bb > 0 ? 1 - dot / (2 * bb) : 1;
  Vector out(a.size());
  for (size_t k = 0; k < a.size(); ++k) out[k] = ca * a[k] + cb * b[k];
  return out;
}

// Every rank's vector combined up the tree: at level d, the block of d ranks from g meets the
// block from g + d, the lower block's vector first.
inline Vector Tree(std::vector<Vector> of_rank) {
  const size_t size = of_rank.size();
  for (size_t d = 1; d < size; d *= 2) {
    for (size_t g = 0; g < size; g += 2 * d) of_rank[g] = Combine(of_rank[g], of_rank[g + d]);
  }
  return of_rank[0];
}

inline Vector Reference(int size, int t, int64_t n, double prescale = 1) {
  std::vector<Vector> of_rank(static_cast<size_t>(size), Vector(static_cast<size_t>(n)));
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < n; ++i) of_rank[r][i] = prescale * Input(r, t, i);
  }
  return Tree(of_rank);
}

inline double Allowed(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat64:
      return 1e-12;
    case DataType::kFloat32:
      return 1e-5;
    default:
      return 3e-2;  // half precision: inputs and result rounded to 8 or 11 bits
  }
}

// Every rank ends with the same bytes.
inline bool SameOnEveryRank(HostTensor* t, size_t element_size) {
  std::vector<unsigned char> mine(
      static_cast<unsigned char*>(t->data()),
      static_cast<unsigned char*>(t->data()) + t->size() * element_size);
  std::vector<unsigned char> root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = root == mine ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all == 1;
}

// Whether `t` holds tensor `seed`'s tree when only ranks below `running` ran it: the others joined
// and took part with zeros.
inline ::testing::AssertionResult IsTreeWithJoined(const HostTensor& t, int size, int running,
                                                   int seed) {
  std::vector<Vector> of_rank(static_cast<size_t>(size), Vector(static_cast<size_t>(t.size())));
  for (int r = 0; r < running; ++r) {
    for (int64_t i = 0; i < t.size(); ++i) of_rank[r][i] = Input(r, seed, i);
  }
  const Vector want = Tree(of_rank);
  for (int64_t i = 0; i < t.size(); ++i) {
    if (std::fabs(t.Get(i) - want[i]) > 1e-12 * (1 + std::fabs(want[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << t.Get(i) << ", wanted " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing
}  // namespace gradsync
