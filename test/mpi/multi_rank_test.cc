#include "test/mpi/multi_rank_test.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "runtime/half.h"

namespace gradsync {
namespace testing {

void MultiRankTest::SetUp() {
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  init();
}

void MultiRankTest::TearDown() {
  shutdown();
  int failed_here = HasFailure() ? 1 : 0;
  int failed_anywhere = 0;
  MPI_Allreduce(&failed_here, &failed_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed_anywhere && !failed_here) ADD_FAILURE() << "this test failed on another rank";
}

bool CallerReduces(int ranks) {
  const char* caller_reduce = std::getenv("GRADSYNC_CALLER_REDUCE");
  if (caller_reduce != nullptr && std::string(caller_reduce) == "0") return false;
  const char* shm = std::getenv("GRADSYNC_SHM_THRESHOLD");
  return ranks <= 2 || (shm != nullptr && std::string(shm) == "0");
}

::testing::AssertionResult Succeeds(const Handle& handle) {
  try {
    if (!handle.wait_for(kWaitLimit)) return ::testing::AssertionFailure() << "wait timed out";
  } catch (const Error& e) {
    return ::testing::AssertionFailure() << "failed: " << e.what();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult FailsWith(const Handle& handle, StatusCode code,
                                     const std::string& needle) {
  return ThrowsWith(
      [&] {
        if (!handle.wait_for(kWaitLimit)) throw Error(Status::Timeout("wait timed out"));
      },
      code, needle);
}

HostTensor::HostTensor(DataType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  elements_ = 1;
  for (int64_t d : shape_) elements_ *= d;
  bytes_.assign(static_cast<size_t>(elements_) * DataTypeSize(dtype_), 0);
}

TensorView HostTensor::view() { return TensorView(bytes_.data(), dtype_, shape_); }

Allocator Into(std::unique_ptr<HostTensor>* out) {
  return [out](const std::vector<int64_t>& shape, DataType dtype) {
    *out = std::make_unique<HostTensor>(dtype, shape);
    return (*out)->data();
  };
}

namespace {

template <typename T>
void Store(std::vector<unsigned char>* bytes, int64_t i, T v) {
  std::memcpy(bytes->data() + i * sizeof(T), &v, sizeof(T));
}
template <typename T>
T Load(const std::vector<unsigned char>& bytes, int64_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

}  // namespace

void HostTensor::Set(int64_t i, double value) {
  switch (dtype_) {
    case DataType::kUInt8:
      Store<uint8_t>(&bytes_, i, static_cast<uint8_t>(value));
      break;
    case DataType::kInt8:
      Store<int8_t>(&bytes_, i, static_cast<int8_t>(value));
      break;
    case DataType::kInt32:
      Store<int32_t>(&bytes_, i, static_cast<int32_t>(value));
      break;
    case DataType::kInt64:
      Store<int64_t>(&bytes_, i, static_cast<int64_t>(value));
      break;
    case DataType::kFloat16:
      Store<uint16_t>(&bytes_, i, FloatToHalf(static_cast<float>(value)));
      break;
    case DataType::kBFloat16:
      Store<uint16_t>(&bytes_, i, FloatToBFloat16(static_cast<float>(value)));
      break;
    case DataType::kFloat32:
      Store<float>(&bytes_, i, static_cast<float>(value));
      break;
    case DataType::kFloat64:
      Store<double>(&bytes_, i, value);
      break;
  }
}

double HostTensor::Get(int64_t i) const {
  switch (dtype_) {
    case DataType::kUInt8:
      return Load<uint8_t>(bytes_, i);
    case DataType::kInt8:
      return Load<int8_t>(bytes_, i);
    case DataType::kInt32:
      return Load<int32_t>(bytes_, i);
    case DataType::kInt64:
      return static_cast<double>(Load<int64_t>(bytes_, i));
    case DataType::kFloat16:
      return HalfToFloat(Load<uint16_t>(bytes_, i));
    case DataType::kBFloat16:
      return BFloat16ToFloat(Load<uint16_t>(bytes_, i));
    case DataType::kFloat32:
      return Load<float>(bytes_, i);
    case DataType::kFloat64:
      return Load<double>(bytes_, i);
  }
  return 0;
}

std::vector<DataType> AllDataTypes() {
  return {DataType::kUInt8,   DataType::kInt8,     DataType::kInt32,   DataType::kInt64,
          DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64};
}

const std::vector<ReduceOp> kAllReduceOps = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProduct};

double Value(ReduceOp op, int rank, int64_t i) {
  if (op == ReduceOp::kProduct) return 1 + (i + rank) % 2;
  return (i * 7 + rank * 3) % 7;
}

double Expected(ReduceOp op, DataType dtype, int size, int64_t i) {
  double acc = Value(op, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Value(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage:
        acc += v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      case ReduceOp::kAdasum:  // not element-wise: adasum_test has its own reference
        break;
    }
  }
  if (op == ReduceOp::kAverage) {
    acc /= size;
    if (!IsFloatingPoint(dtype)) acc = std::trunc(acc);
  }
  return acc;
}

double Tolerance(DataType dtype, double expected) {
  switch (dtype) {
    case DataType::kFloat16:
      return std::abs(expected) * 1e-3;
    case DataType::kBFloat16:
      return std::abs(expected) * 8e-3;
    default:
      return 0;
  }
}

}  // namespace testing
}  // namespace gradsync

// GRADSYNC_TEST_MPI_THREAD_LEVEL=serialized runs a binary as an application that initialized MPI
// with less than MPI_THREAD_MULTIPLE.
int main(int argc, char** argv) {
  const char* level = std::getenv("GRADSYNC_TEST_MPI_THREAD_LEVEL");
  const bool serialized = level != nullptr && std::string(level) == "serialized";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE,
                  &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
