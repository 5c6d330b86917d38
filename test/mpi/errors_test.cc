// Mismatched parameters fail on every rank and later collectives still work; bad input is
// rejected at enqueue with a clear error.
#include <atomic>
#include <limits>
#include <memory>
#include <thread>

#include "ops/device/device_plane_factory.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

template <typename Options>
Options Named(const std::string& name) {
  Options options;
  options.name = name;
  return options;
}

template <typename Options>
Options Grouped(const std::vector<std::string>& names) {
  Options options;
  options.names = names;
  return options;
}

class ErrorsTest : public MultiRankTest {
 protected:
  // After an error, the runtime must still reduce correctly.
  void ExpectLaterAllreduceWorks(const std::string& name) {
    HostTensor t(DataType::kInt32, {5});
    for (int64_t i = 0; i < 5; ++i) t.Set(i, rank_ + i);
    AllreduceOptions options;
    options.name = name;
    ASSERT_TRUE(Succeeds(allreduce(t.view(), options)));
    EXPECT_EQ(t.Get(4), 4.0 * size_ + size_ * (size_ - 1) / 2.0);
  }

  // Runs an allreduce of `x` where the last rank's parameters differ as `change` says.
  void ExpectMismatch(const std::string& needle,
                      const std::function<void(TensorView*, AllreduceOptions*)>& change) {
    if (size_ < 2) GTEST_SKIP() << "needs two ranks";
    HostTensor a(DataType::kFloat32, {6}), b(DataType::kInt32, {6}), c(DataType::kFloat32, {7});
    TensorView view = a.view();
    AllreduceOptions options;
    options.name = "mismatch." + needle;
    if (rank_ == size_ - 1) {
      change(&view, &options);
      if (view.dtype == DataType::kInt32) view.data = b.data();
      if (view.shape == std::vector<int64_t>{7}) view.data = c.data();
    }
    const std::string last = std::to_string(size_ - 1);
    EXPECT_TRUE(FailsWith(allreduce(view, options), StatusCode::kMismatch, needle));
    EXPECT_TRUE(FailsWith(allreduce(view, options), StatusCode::kMismatch, "rank " + last));
    ExpectLaterAllreduceWorks("after." + needle);
  }
};

TEST_F(ErrorsTest, MismatchedDtype) {
  ExpectMismatch("dtype", [](TensorView* v, AllreduceOptions*) { v->dtype = DataType::kInt32; });
}

TEST_F(ErrorsTest, MismatchedShape) {
  ExpectMismatch("shape", [](TensorView* v, AllreduceOptions*) { v->shape = {7}; });
}

TEST_F(ErrorsTest, MismatchedReduceOp) {
  ExpectMismatch("reduce op", [](TensorView*, AllreduceOptions* o) { o->op = ReduceOp::kMax; });
}

TEST_F(ErrorsTest, MismatchedPrescale) {
  ExpectMismatch("prescale", [](TensorView*, AllreduceOptions* o) { o->prescale = 3.0; });
}

TEST_F(ErrorsTest, MismatchedPostscale) {
  ExpectMismatch("postscale", [](TensorView*, AllreduceOptions* o) { o->postscale = 0.5; });
}

TEST_F(ErrorsTest, MismatchedOperation) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  HostTensor t(DataType::kFloat32, {4});
  Handle h = rank_ == 0 ? broadcast(t.view(), 0, {"op.x", nullptr, {}, {}})
                        : allreduce(t.view(), {"op.x", ReduceOp::kSum, 1.0, 1.0, nullptr, {}, {}});
  EXPECT_TRUE(FailsWith(h, StatusCode::kMismatch, "operation"));
  ExpectLaterAllreduceWorks("after.op");
}

TEST_F(ErrorsTest, MismatchedRoot) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  HostTensor t(DataType::kFloat32, {4});
  Handle h = broadcast(t.view(), rank_ == 0 ? 0 : 1, {"root.x", nullptr, {}, {}});
  EXPECT_TRUE(FailsWith(h, StatusCode::kMismatch, "root rank"));
  ExpectLaterAllreduceWorks("after.root");
}

TEST_F(ErrorsTest, MismatchAfterTheTensorWasCached) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  HostTensor small(DataType::kFloat32, {4}), big(DataType::kFloat32, {8});
  AllreduceOptions options;
  options.name = "cached.w";
  ASSERT_TRUE(Succeeds(allreduce(small.view(), options)));
  ASSERT_TRUE(Succeeds(allreduce(small.view(), options)));  // served from the cache
  TensorView v = rank_ == 1 ? big.view() : small.view();
  EXPECT_TRUE(FailsWith(allreduce(v, options), StatusCode::kMismatch, "shape"));
  ASSERT_TRUE(Succeeds(allreduce(small.view(), options)));
}

TEST_F(ErrorsTest, NullDataWithElements) {
  TensorView v(nullptr, DataType::kFloat32, {3});
  EXPECT_TRUE(ThrowsWith([&] { allreduce(v); }, StatusCode::kInvalidArgument, "data is null"));
  // Null data is fine when there is nothing to read.
  TensorView empty(nullptr, DataType::kFloat32, {0});
  EXPECT_TRUE(Succeeds(allreduce(empty)));
}

TEST_F(ErrorsTest, NegativeDimension) {
  float x[4];
  TensorView v(x, DataType::kFloat32, {2, -2});
  EXPECT_TRUE(ThrowsWith([&] { allreduce(v); }, StatusCode::kInvalidArgument, "negative"));
  EXPECT_TRUE(ThrowsWith([&] { broadcast(v, 0); }, StatusCode::kInvalidArgument, "negative"));
}

TEST_F(ErrorsTest, OverflowingShape) {
  float x[4];
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  TensorView v(x, DataType::kFloat32, {big, 4});
  EXPECT_TRUE(ThrowsWith([&] { allreduce(v); }, StatusCode::kInvalidArgument, "overflows"));
}

// An empty tensor whose other dimensions multiply past 64 bits, in either order, is refused at
// enqueue by every collective, with one message whose context appears once.
TEST_F(ErrorsTest, EmptyShapeWithOverflowingDimensionsIsRefusedByEveryCollective) {
  float x[4] = {};
  const int64_t big = int64_t{1} << 40;
  const Allocator allocate = [&x](const std::vector<int64_t>&, DataType) { return x; };
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{0, big, big}, std::vector<int64_t>{big, big, 0}}) {
    const TensorView v(x, DataType::kFloat32, shape);
    const std::string needle = "tensor 'empty' on rank " + std::to_string(rank_) + ": shape " +
                               ShapeString(shape) + " overflows a 64-bit byte count";
    const std::vector<std::string> names = {"empty"};
    const std::vector<std::function<void()>> enqueues = {
        [&] { allreduce(v, Named<AllreduceOptions>("empty")); },
        [&] { allgather(v, allocate, Named<AllgatherOptions>("empty")); },
        [&] { broadcast(v, 0, Named<BroadcastOptions>("empty")); },
        [&] { reducescatter(v, allocate, Named<ReducescatterOptions>("empty")); },
        [&] { alltoall(v, allocate, Named<AlltoallOptions>("empty")); },
        [&] { grouped_allreduce({v}, Grouped<GroupedAllreduceOptions>(names)); },
        [&] { grouped_allgather({v}, {allocate}, Grouped<GroupedAllgatherOptions>(names)); },
        [&] {
          grouped_reducescatter({v}, {allocate}, Grouped<GroupedReducescatterOptions>(names));
        },
    };
    for (size_t i = 0; i < enqueues.size(); ++i) {
      SCOPED_TRACE("enqueue " + std::to_string(i) + " of " + ShapeString(shape));
      std::string message;
      EXPECT_TRUE(ThrowsWith(
          [&] {
            try {
              enqueues[i]();
            } catch (const Error& e) {
              message = e.what();
              throw;
            }
          },
          StatusCode::kInvalidArgument, needle));
      EXPECT_EQ(message.find("of tensor"), message.rfind("of tensor")) << message;
    }
  }
  ExpectLaterAllreduceWorks("after.empty");
}

TEST_F(ErrorsTest, NamesAndRanksBeyondTheWireLimits) {
  float x[4] = {};
  AllreduceOptions options;
  options.name = std::string(100000, 'n');
  EXPECT_TRUE(ThrowsWith([&] { allreduce(TensorView(x, DataType::kFloat32, {4}), options); },
                         StatusCode::kInvalidArgument, "tensor name"));
  EXPECT_TRUE(
      ThrowsWith([&] { allreduce(TensorView(x, DataType::kFloat32, std::vector<int64_t>(65, 1))); },
                 StatusCode::kInvalidArgument, "dimensions"));
}

TEST_F(ErrorsTest, UnknownDtypeAndReduceOp) {
  float x[4];
  TensorView v(x, static_cast<DataType>(42), {4});
  EXPECT_TRUE(ThrowsWith([&] { allreduce(v); }, StatusCode::kInvalidArgument, "unknown dtype"));
  AllreduceOptions options;
  options.op = static_cast<ReduceOp>(9);
  EXPECT_TRUE(ThrowsWith([&] { allreduce(TensorView(x, DataType::kFloat32, {4}), options); },
                         StatusCode::kInvalidArgument, "unknown reduce op"));
}

TEST_F(ErrorsTest, NonFiniteScaleFactor) {
  float x[4] = {};
  AllreduceOptions options;
  options.prescale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(ThrowsWith([&] { allreduce(TensorView(x, DataType::kFloat32, {4}), options); },
                         StatusCode::kInvalidArgument, "prescale"));
}

TEST_F(ErrorsTest, OutputThatDiffersFromInput) {
  float in[4] = {}, out[5] = {};
  EXPECT_TRUE(ThrowsWith(
      [&] {
        allreduce(TensorView(in, DataType::kFloat32, {4}),
                  TensorView(out, DataType::kFloat32, {5}));
      },
      StatusCode::kInvalidArgument, "differs from input"));
}

TEST_F(ErrorsTest, BroadcastRootOutOfRange) {
  float x[4] = {};
  EXPECT_TRUE(ThrowsWith([&] { broadcast(TensorView(x, DataType::kFloat32, {4}), size_); },
                         StatusCode::kInvalidArgument, "root rank"));
}

TEST_F(ErrorsTest, AllgatherWithoutAllocator) {
  float x[4] = {};
  EXPECT_TRUE(ThrowsWith([&] { allgather(TensorView(x, DataType::kFloat32, {4}), nullptr); },
                         StatusCode::kInvalidArgument, "allocator"));
}

TEST_F(ErrorsTest, AllgatherAllocatorFailureFailsTheHandle) {
  float x[4] = {};
  Handle h = allgather(TensorView(x, DataType::kFloat32, {4}),
                       [](const std::vector<int64_t>&, DataType) { return nullptr; });
  EXPECT_TRUE(FailsWith(h, StatusCode::kInvalidArgument, "alloc"));
  ExpectLaterAllreduceWorks("after.alloc");
}

// A device tensor on a machine without a GPU (or a build without CUDA) fails at its first
// operation, on every rank alike, with an error saying why; host work goes on.
TEST_F(ErrorsTest, DeviceTensorWithoutAUsableDeviceFailsClearly) {
  int devices = 0;
  if (BuiltWithCuda() && UsableCudaDevices(&devices) && devices > 0) {
    GTEST_SKIP() << "this machine has a CUDA device";
  }
  float x[4] = {};
  for (int attempt = 0; attempt < 2; ++attempt) {  // the failure is kept, not retried
    Handle h =
        allreduce(TensorView(x, DataType::kFloat32, {4}, Device::Cuda(0)),
                  {"device." + std::to_string(attempt), ReduceOp::kSum, 1, 1, nullptr, {}, {}});
    if (BuiltWithCuda()) {
      EXPECT_TRUE(FailsWith(h, StatusCode::kCudaError, "no CUDA device is usable"));
    } else {
      EXPECT_TRUE(FailsWith(h, StatusCode::kUnsupported, "built without CUDA"));
    }
  }
  ExpectLaterAllreduceWorks("after.device");
}

TEST_F(ErrorsTest, UnknownDeviceKindIsAnInvalidArgument) {
  float x[4] = {};
  TensorView v(x, DataType::kFloat32, {4});
  v.device.kind = static_cast<DeviceKind>(7);
  EXPECT_TRUE(
      ThrowsWith([&] { allreduce(v); }, StatusCode::kInvalidArgument, "unknown device kind 7"));
  EXPECT_TRUE(
      ThrowsWith([&] { broadcast(v, 0); }, StatusCode::kInvalidArgument, "unknown device kind 7"));
}

// What a blocking call made inside a completion callback threw, if anything.
struct CallbackOutcome {
  std::atomic<bool> ran{false};
  StatusCode code = StatusCode::kOk;
  std::string message;
};

// Runs `call` inside the callback of an allreduce on every rank and returns what it threw.
// Callbacks run on gradsync's background thread, which completes every handle, so a blocking call
// there must be refused with an error rather than deadlock; every rank then goes on.
template <typename Call>
void RunInsideCallback(CallbackOutcome* outcome, const Call& call) {
  float x[4] = {};
  AllreduceOptions options;
  options.name = "callback.blocking";
  options.on_complete = [outcome, call](const Status&) {
    try {
      call();
    } catch (const Error& e) {
      outcome->code = e.code();
      outcome->message = e.what();
    } catch (const std::exception& e) {
      outcome->code = StatusCode::kInternal;
      outcome->message = std::string("not a gradsync::Error: ") + e.what();
    }
    outcome->ran = true;
  };
  ASSERT_TRUE(Succeeds(allreduce(TensorView(x, DataType::kFloat32, {4}), options)));
  ASSERT_TRUE(outcome->ran.load());
}

TEST_F(ErrorsTest, WaitingInsideACallbackIsAnErrorAndEveryRankGoesOn) {
  // The callback's own handle, published once the enqueue returns.
  std::atomic<const Handle*> own{nullptr};
  float x[4] = {};
  CallbackOutcome waited_own;
  AllreduceOptions options;
  options.name = "callback.own";
  options.on_complete = [&](const Status&) {
    const Handle* handle = nullptr;
    while ((handle = own.load()) == nullptr) std::this_thread::yield();
    try {
      handle->wait();
    } catch (const Error& e) {
      waited_own.code = e.code();
      waited_own.message = e.what();
    }
    waited_own.ran = true;
  };
  const Handle handle = allreduce(TensorView(x, DataType::kFloat32, {4}), options);
  own = &handle;
  ASSERT_TRUE(Succeeds(handle));
  ASSERT_TRUE(waited_own.ran.load());
  EXPECT_EQ(waited_own.code, StatusCode::kInvalidArgument) << waited_own.message;
  EXPECT_NE(waited_own.message.find("Handle::wait() was called from a completion callback"),
            std::string::npos)
      << waited_own.message;

  // Another handle, even a finished one, and with a time limit.
  float y[4] = {};
  const Handle other =
      allreduce(TensorView(y, DataType::kFloat32, {4}), Named<AllreduceOptions>("callback.other"));
  ASSERT_TRUE(Succeeds(other));
  CallbackOutcome waited_other;
  RunInsideCallback(&waited_other, [other] { other.wait_for(std::chrono::seconds(30)); });
  EXPECT_EQ(waited_other.code, StatusCode::kInvalidArgument) << waited_other.message;
  EXPECT_NE(waited_other.message.find("Handle::wait_for()"), std::string::npos)
      << waited_other.message;

  CallbackOutcome joined;
  RunInsideCallback(&joined, [] { join(); });
  EXPECT_NE(joined.message.find("join() was called from a completion callback"), std::string::npos)
      << joined.message;
  ExpectLaterAllreduceWorks("after.callback.wait");
}

TEST_F(ErrorsTest, ShutdownInsideACallbackIsAnError) {
  CallbackOutcome outcome;
  RunInsideCallback(&outcome, [] { shutdown(); });
  EXPECT_EQ(outcome.code, StatusCode::kInvalidArgument) << outcome.message;
  EXPECT_NE(outcome.message.find("shutdown() was called from a completion callback"),
            std::string::npos)
      << outcome.message;
  EXPECT_TRUE(is_initialized());
  ExpectLaterAllreduceWorks("after.callback.shutdown");
}

// An operation pending when another rank shuts down fails with the message the user guide gives.
TEST_F(ErrorsTest, PendingOperationsFailWithTheDocumentedShutdownError) {
  if (size_ < 2) GTEST_SKIP() << "needs a second rank to shut down";
  float x[4] = {};
  Handle pending;
  if (rank_ == 0) {
    pending = allreduce(TensorView(x, DataType::kFloat32, {4}),
                        Named<AllreduceOptions>("submitted.on.rank0.only"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == size_ - 1) shutdown();
  if (rank_ == 0) {
    EXPECT_TRUE(FailsWith(pending, StatusCode::kShutdown,
                          "gradsync was shut down before this operation completed (shutdown() "
                          "was called on another rank)"));
    EXPECT_TRUE(ThrowsWith([&] { allreduce(TensorView(x, DataType::kFloat32, {4})); },
                           StatusCode::kShutdown, "before this operation completed"));
  }
}

TEST_F(ErrorsTest, DuplicateNameInFlight) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks to hold the first one in flight";
  float a[4] = {}, b[4] = {};
  AllreduceOptions options;
  options.name = "dup";
  Handle first;
  if (rank_ == 0) {
    // The other ranks enqueue "dup" only after the barrier, so it is surely still in flight here.
    first = allreduce(TensorView(a, DataType::kFloat32, {4}), options);
    EXPECT_TRUE(ThrowsWith([&] { allreduce(TensorView(b, DataType::kFloat32, {4}), options); },
                           StatusCode::kInvalidArgument, "already in flight"));
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    first = allreduce(TensorView(a, DataType::kFloat32, {4}), options);
  }
  ASSERT_TRUE(Succeeds(first));
  // Once complete, the name may be used again.
  ASSERT_TRUE(Succeeds(allreduce(TensorView(b, DataType::kFloat32, {4}), options)));
}

TEST(LifecycleTest, EnqueueBeforeInitAndAfterShutdown) {
  float x[4] = {};
  const TensorView v(x, DataType::kFloat32, {4});
  ASSERT_FALSE(is_initialized());
  EXPECT_TRUE(ThrowsWith([&] { allreduce(v); }, StatusCode::kNotInitialized, "init"));
  EXPECT_TRUE(ThrowsWith([&] { rank(); }, StatusCode::kNotInitialized, "init"));
  init();
  init();  // a second init is a no-op
  ASSERT_TRUE(Succeeds(allreduce(v)));
  shutdown();
  EXPECT_TRUE(ThrowsWith([&] { allreduce(v); }, StatusCode::kNotInitialized, "shut down"));
  EXPECT_TRUE(ThrowsWith([&] { barrier(); }, StatusCode::kNotInitialized, "init"));
  shutdown();  // a second shutdown is a no-op
}

TEST(LifecycleTest, BadConfigurationIsReportedAtInit) {
  setenv("GRADSYNC_CYCLE_TIME_MS", "fast", 1);
  EXPECT_TRUE(ThrowsWith([] { init(); }, StatusCode::kInvalidArgument, "GRADSYNC_CYCLE_TIME_MS"));
  unsetenv("GRADSYNC_CYCLE_TIME_MS");
  EXPECT_FALSE(is_initialized());
}

// A setting that does not parse on one rank only (a per-rank wrapper's typo): every rank's init
// fails with that rank's error, where the others waited for it in init's collectives for good.
TEST(LifecycleTest, ASettingThatDoesNotParseOnOneRankFailsEveryRanksInit) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size < 2) GTEST_SKIP() << "needs two ranks";
  if (world_rank == 1) setenv("GRADSYNC_CYCLE_TIME_MS", "fast", 1);
  EXPECT_TRUE(ThrowsWith([] { init(); }, StatusCode::kInvalidArgument, "GRADSYNC_CYCLE_TIME_MS"));
  EXPECT_TRUE(ThrowsWith([] { init(); }, StatusCode::kInvalidArgument, "(on rank 1)"));
  unsetenv("GRADSYNC_CYCLE_TIME_MS");
  EXPECT_FALSE(is_initialized());
}

// Settings that decide which collectives run, set on some ranks only (mpirun without -x on a
// remote host): every rank's init fails, naming the variable, where the ranks would have hung.
TEST(LifecycleTest, SettingsThatShapeCollectivesDifferingBetweenRanksFailInit) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size < 2) GTEST_SKIP() << "needs two ranks";
  for (const char* variable :
       {"GRADSYNC_FUSION_THRESHOLD", "GRADSYNC_AUTOTUNE", "GRADSYNC_HIERARCHICAL_ALLREDUCE",
        "GRADSYNC_LOCK_AFTER_STEPS"}) {
    if (world_rank % 2 == 1) setenv(variable, "1", 1);
    EXPECT_TRUE(ThrowsWith([] { init(); }, StatusCode::kInvalidArgument,
                           std::string(variable) + " differs between ranks"));
    unsetenv(variable);
    EXPECT_FALSE(is_initialized());
  }
}

TEST(LifecycleTest, InitOnASubCommunicator) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
  init(half);
  EXPECT_EQ(size(), (world_size + 1 - world_rank % 2) / 2);
  int value = 1;
  ASSERT_TRUE(Succeeds(allreduce(TensorView(&value, DataType::kInt32, {}))));
  EXPECT_EQ(value, size());
  shutdown();
  MPI_Comm_free(&half);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
