// Shared pieces of the multi-rank tests, run as `mpirun -np N <test>`.
//
// The test process initializes MPI itself (so gradsync runs on an application-owned MPI, and can be
// initialized and shut down once per test). Pass/fail is collective: a test that fails on any rank
// fails on every rank, and every wait is bounded, so one failing rank cannot hang the others.
#pragma once

#include <gradsync/gradsync.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace gradsync {
namespace testing {

constexpr std::chrono::seconds kWaitLimit{60};

// gradsync::init() before each test, shutdown() after it, and the collective verdict.
class MultiRankTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  int rank_ = 0;
  int size_ = 1;
};

// Whether batches' last buckets get lanes in this run: GRADSYNC_CALLER_REDUCE is on (unless "0"),
// and with `ranks` ranks on this one node the small buckets of the tests do not go through node
// shared memory, which takes them past two ranks unless GRADSYNC_SHM_THRESHOLD=0.
bool CallerReduces(int ranks);

// Waits (bounded) for a handle that must succeed.
::testing::AssertionResult Succeeds(const Handle& handle);
// Waits (bounded) for a handle that must fail with `code` and a message containing `needle`.
::testing::AssertionResult FailsWith(const Handle& handle, StatusCode code,
                                     const std::string& needle);
// Runs `enqueue`, which must throw gradsync::Error with `code` and a message containing `needle`.
template <typename F>
::testing::AssertionResult ThrowsWith(F&& enqueue, StatusCode code, const std::string& needle) {
  try {
    enqueue();
  } catch (const Error& e) {
    if (e.code() != code) {
      return ::testing::AssertionFailure()
             << "threw " << e.status().ToString() << ", wanted " << StatusCodeName(code);
    }
    if (std::string(e.what()).find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << e.what();
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// A host buffer of one dtype whose elements are set and read as doubles.
class HostTensor {
 public:
  HostTensor(DataType dtype, std::vector<int64_t> shape);
  TensorView view();
  int64_t size() const { return elements_; }
  void Set(int64_t i, double value);
  double Get(int64_t i) const;
  void* data() { return bytes_.data(); }

 private:
  DataType dtype_;
  std::vector<int64_t> shape_;
  int64_t elements_;
  std::vector<unsigned char> bytes_;
};

// An allocator that places the output in a new HostTensor at *out (which must outlive the handle).
Allocator Into(std::unique_ptr<HostTensor>* out);

std::vector<DataType> AllDataTypes();

extern const std::vector<ReduceOp> kAllReduceOps;
// Small integers every dtype holds exactly, whose sums and products over 4 ranks stay exact: rank
// `rank`'s element `i` for a reduction with `op`.
double Value(ReduceOp op, int rank, int64_t i);
// Element `i` of the reduction of Value over `size` ranks, as `dtype` holds it.
double Expected(ReduceOp op, DataType dtype, int size, int64_t i);
// How far a result of `dtype` may be from `expected` (0: exact).
double Tolerance(DataType dtype, double expected);

}  // namespace testing
}  // namespace gradsync
