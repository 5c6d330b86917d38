// MpiDataPlane's tests on a one-rank communicator: MPI initialized on first use, a typed host
// tensor, and a fixture with the plane over a duplicate of MPI_COMM_SELF. Named namespace: the
// unit tests share one binary.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ops/mpi/mpi_data_plane.h"
#include "runtime/half.h"

namespace gradsync {
namespace mpi_plane_test {

// Initializes MPI on first use rather than at start-up, so the other unit tests in this binary
// (run one per process by CTest) do not pay for it; finalizes at exit only if it initialized.
class MpiEnvironment : public ::testing::Environment {
 public:
  static void EnsureInitialized() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), MPI_SUCCESS);
    owns_mpi_ = true;
  }
  void TearDown() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Finalize();
  }

 private:
  static inline bool owns_mpi_ = false;
};

inline const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt32,
                                     DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16,
                                     DataType::kFloat32, DataType::kFloat64};

// A typed host tensor holding small integer values, which every dtype represents exactly.
class HostTensor {
 public:
  HostTensor(DataType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    bytes_.resize(static_cast<size_t>(View().num_bytes()) + 1);
  }
  TensorView View() { return TensorView(bytes_.data(), dtype_, shape_); }
  int64_t size() const { return TensorView(nullptr, dtype_, shape_).num_elements(); }

  void Set(int64_t i, double v) {
    uint8_t* p = bytes_.data() + i * DataTypeSize(dtype_);
    switch (dtype_) {
      case DataType::kUInt8:
        return Put(p, static_cast<uint8_t>(v));
      case DataType::kInt8:
        return Put(p, static_cast<int8_t>(v));
      case DataType::kInt32:
        return Put(p, static_cast<int32_t>(v));
      case DataType::kInt64:
        return Put(p, static_cast<int64_t>(v));
      case DataType::kFloat16:
        return Put(p, FloatToHalf(static_cast<float>(v)));
      case DataType::kBFloat16:
        return Put(p, FloatToBFloat16(static_cast<float>(v)));
      case DataType::kFloat32:
        return Put(p, static_cast<float>(v));
      case DataType::kFloat64:
        return Put(p, v);
    }
  }

  double Get(int64_t i) const {
    const uint8_t* p = bytes_.data() + i * DataTypeSize(dtype_);
    switch (dtype_) {
      case DataType::kUInt8:
        return Take<uint8_t>(p);
      case DataType::kInt8:
        return Take<int8_t>(p);
      case DataType::kInt32:
        return Take<int32_t>(p);
      case DataType::kInt64:
        return static_cast<double>(Take<int64_t>(p));
      case DataType::kFloat16:
        return HalfToFloat(Take<uint16_t>(p));
      case DataType::kBFloat16:
        return BFloat16ToFloat(Take<uint16_t>(p));
      case DataType::kFloat32:
        return Take<float>(p);
      case DataType::kFloat64:
        return Take<double>(p);
    }
    return 0;
  }

  // Element i holds (i % 9) + 1 + base.
  void Fill(double base) {
    for (int64_t i = 0; i < size(); ++i) Set(i, static_cast<double>(i % 9 + 1) + base);
  }

 private:
  template <typename T>
  static void Put(uint8_t* p, T v) {
    std::memcpy(p, &v, sizeof(v));
  }
  template <typename T>
  static T Take(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }

  DataType dtype_;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> bytes_;
};

inline std::unique_ptr<TensorEntry> MakeEntry(const std::string& name, HostTensor* input,
                                              HostTensor* output) {
  auto entry = std::make_unique<TensorEntry>();
  entry->name = name;
  entry->input = input->View();
  entry->output = output->View();
  entry->state = std::make_shared<OpState>();
  return entry;
}

class MpiDataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(MpiEnvironment::EnsureInitialized());
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_SELF, &comm_), MPI_SUCCESS);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    plane_ = std::make_unique<MpiDataPlane>(comm_);
  }
  void TearDown() override {
    plane_.reset();
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  // Reducescatter's entries that failed on this rank alone.
  Status Reducescatter(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) {
    failures_.clear();
    return plane_->Reducescatter(entries, spec, &failures_);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<MpiDataPlane> plane_;
  std::vector<LocalFailure> failures_;
};

inline ReduceSpec Spec(DataType dtype, ReduceOp op, double prescale = 1.0, double postscale = 1.0) {
  ReduceSpec spec;
  spec.dtype = dtype;
  spec.op = op;
  spec.prescale = prescale;
  spec.postscale = postscale;
  return spec;
}

inline void ExpectScaled(const HostTensor& actual, const HostTensor& source, double factor) {
  for (int64_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(actual.Get(i), source.Get(i) * factor) << "element " << i;
  }
}

}  // namespace mpi_plane_test
}  // namespace gradsync
