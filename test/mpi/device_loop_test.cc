// The whole path of device tensors without a GPU: the public API, negotiation, the background
// loop's hand-off to the finalizer thread, and completion, with the process sets' device planes
// made over the host backend (SetDevicePlaneFactoryForTesting). The "device" tensors are host
// memory labelled cuda:0; everything above the backend runs as it does on a GPU.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ops/device/producer_readiness.h"
#include "test/host_stream_readiness.h"
#include "test/mpi/device_loop_fixture.h"

namespace gradsync {
namespace testing {
namespace {

TEST_F(DeviceLoopTest, DeviceAndHostTensorsInFlightTogether) {
  for (int step = 0; step < 3; ++step) {
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<Handle> handles;
    std::atomic<int> callbacks{0};
    for (int i = 0; i < 40; ++i) {
      const bool device = i % 2 == 0;
      tensors.push_back(
          std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{1 + i * 37}));
      for (int64_t k = 0; k < tensors.back()->size(); ++k) tensors.back()->Set(k, rank_ + k % 3);
      AllreduceOptions options;
      options.name = std::string(device ? "dev." : "host.") + std::to_string(i);
      options.op = ReduceOp::kAverage;
      options.on_complete = [&callbacks](const Status& s) {
        if (s.ok()) callbacks++;
      };
      handles.push_back(
          allreduce(device ? OnDevice(tensors.back().get()) : tensors.back()->view(), options));
    }
    for (Handle& h : handles) ASSERT_TRUE(Succeeds(h));
    EXPECT_EQ(callbacks.load(), 40);
    const double mean_rank = (size_ - 1) / 2.0;
    for (auto& t : tensors) {
      for (int64_t k = 0; k < t->size(); ++k) ASSERT_EQ(t->Get(k), mean_rank + k % 3);
    }
  }
}

TEST_F(DeviceLoopTest, EveryCollectiveOnDeviceTensors) {
  HostTensor mine(DataType::kInt32, {rank_ + 1, 2});
  for (int64_t i = 0; i < mine.size(); ++i) mine.Set(i, rank_);
  std::unique_ptr<HostTensor> gathered;
  Handle g = allgather(OnDevice(&mine), IntoDevice(&gathered));
  HostTensor root(DataType::kFloat64, {4});
  for (int64_t i = 0; i < 4; ++i) root.Set(i, rank_ == 0 ? 7 : 0);
  Handle b = broadcast(OnDevice(&root), 0);
  HostTensor rows(DataType::kFloat32, {2 * size_ + 1});
  for (int64_t i = 0; i < rows.size(); ++i) rows.Set(i, 1);
  std::unique_ptr<HostTensor> share;
  Handle r = reducescatter(OnDevice(&rows), IntoDevice(&share));
  HostTensor sent(DataType::kInt64, {size_});
  for (int64_t i = 0; i < size_; ++i) sent.Set(i, rank_ * 10 + i);
  std::unique_ptr<HostTensor> received;
  Handle a = alltoall(OnDevice(&sent), IntoDevice(&received));
  std::vector<std::unique_ptr<HostTensor>> group;
  std::vector<TensorView> views;
  for (int i = 0; i < 3; ++i) {
    group.push_back(std::make_unique<HostTensor>(DataType::kBFloat16, std::vector<int64_t>{9}));
    for (int64_t k = 0; k < 9; ++k) group.back()->Set(k, 2);
    views.push_back(OnDevice(group.back().get()));
  }
  std::vector<Handle> grouped = grouped_allreduce(views);
  for (Handle* h : {&g, &b, &r, &a}) ASSERT_TRUE(Succeeds(*h));
  for (Handle& h : grouped) ASSERT_TRUE(Succeeds(h));

  ASSERT_NE(gathered, nullptr);
  int64_t at = 0;
  for (int q = 0; q < size_; ++q) {
    for (int i = 0; i < (q + 1) * 2; ++i) EXPECT_EQ(gathered->Get(at++), q);
  }
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(root.Get(i), 7);
  ASSERT_NE(share, nullptr);
  for (int64_t i = 0; i < share->size(); ++i) EXPECT_EQ(share->Get(i), size_);
  ASSERT_NE(received, nullptr);
  for (int q = 0; q < size_; ++q) EXPECT_EQ(received->Get(q), q * 10 + rank_);
  for (auto& t : group) EXPECT_EQ(t->Get(8), 2 * size_);
}

// Rank r has r + 1 steps of device gradients: the joined ranks' stand-ins live in the device
// plane's memory, and each step's sum counts the ranks still running.
TEST_F(DeviceLoopTest, JoinWithDeviceTensors) {
  for (int step = 0; step <= rank_; ++step) {
    HostTensor grad(DataType::kFloat32, {1000});
    for (int64_t i = 0; i < grad.size(); ++i) grad.Set(i, 1);
    AllreduceOptions options;
    options.name = "join.grad";
    ASSERT_TRUE(Succeeds(allreduce(OnDevice(&grad), options)));
    int running = 0;
    for (int q = 0; q < size_; ++q) running += q >= step ? 1 : 0;
    EXPECT_EQ(grad.Get(999), running) << "step " << step;
  }
  const int last = join();
  EXPECT_EQ(last, size_ - 1);
}

TEST_F(DeviceLoopTest, StreamOrderedCompletionOfAHostEventWaitsForTheResult) {
  HostTensor grad(DataType::kFloat64, {50000});
  for (int64_t i = 0; i < grad.size(); ++i) grad.Set(i, rank_ + 1);
  Handle h = allreduce(OnDevice(&grad));
  h.synchronize_stream(nullptr);  // a host completion event: waited on the host
  EXPECT_TRUE(h.poll() || h.wait_for(kWaitLimit));
  EXPECT_EQ(grad.Get(49999), size_ * (size_ + 1) / 2);
}

// DistributedOptimizer's path for device gradients: each started with readiness of its own, the
// step finished by synchronize_stream, beside host tensors the batch fuses. Here the device
// plane's completion events are host events, so the finish waits for them as it must.
TEST_F(DeviceLoopTest, BatchOfDeviceAndHostTensorsFinishedOnAStream) {
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<TensorView> views;
  AllreduceBatchOptions options;
  options.op = ReduceOp::kAverage;
  for (int i = 0; i < 12; ++i) {
    tensors.push_back(
        std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{1 + i * 301}));
    views.push_back(i % 3 == 0 ? tensors.back()->view() : OnDevice(tensors.back().get()));
    options.names.push_back("stream.batch." + std::to_string(i));
  }
  AllreduceBatch batch(views, options);
  for (int step = 0; step < 3; ++step) {
    for (int i = 11; i >= 0; --i) {
      HostTensor& t = *tensors[static_cast<size_t>(i)];
      for (int64_t k = 0; k < t.size(); ++k) t.Set(k, rank_ + step + k % 5);
      if (i % 3 == 0) {
        batch.start(static_cast<size_t>(i), t.view().data);
      } else {
        batch.start(static_cast<size_t>(i), t.view().data, DeviceReadiness{});
      }
    }
    batch.synchronize_stream(nullptr);
    EXPECT_EQ(batch.in_flight(), 0u);
    const double mean_rank = (size_ - 1) / 2.0;
    for (auto& t : tensors) {
      for (int64_t k = 0; k < t->size(); ++k) ASSERT_EQ(t->Get(k), mean_rank + step + k % 5);
    }
  }
}

// A device slot that failed is reported by the step that ordered it, and only by that one.
TEST_F(DeviceLoopTest, ABatchReportsAFailedDeviceSlotOnce) {
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<TensorView> views;
  AllreduceBatchOptions options;
  options.op = ReduceOp::kSum;
  for (int i = 0; i < 2; ++i) {
    tensors.push_back(std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{999}));
    views.push_back(OnDevice(tensors.back().get()));
    options.names.push_back("once.batch." + std::to_string(i));
  }
  AllreduceBatch batch(views, options);
  auto step = [&] {
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (int64_t k = 0; k < tensors[i]->size(); ++k) tensors[i]->Set(k, 1);
      batch.start(i, tensors[i]->view().data, DeviceReadiness{});
    }
    batch.synchronize_stream(nullptr);
  };
  step();
  fail_next_allreduce = true;
  EXPECT_THROW(step(), Error);
  EXPECT_NO_THROW(step()) << "the last step's failure was reported again";
  for (auto& t : tensors) EXPECT_EQ(t->Get(998), size_);
}

// The phases of `row` drawn after the fact ("X" events), in file order, with their times.
struct Phase {
  std::string name;
  int64_t ts = 0;
  int64_t dur = 0;
};
std::vector<Phase> PhasesOf(const Trace& trace, const std::string& row) {
  std::vector<Phase> phases;
  const int64_t tid = trace.RowOf(row);
  for (const Json& e : trace.events) {
    if (IntField(e, "tid") != tid || StringField(e, "ph") != "X") continue;
    phases.push_back({StringField(e, "name"), IntField(e, "ts"), IntField(e, "dur")});
  }
  return phases;
}

// The timeline shows a device bucket's launch on the host and then its phases on the stream, one
// after the other: the wait for its inputs, the copy in, the collective, the copy out.
TEST_F(DeviceLoopTest, TimelineShowsEachBucketsLaunchAndItsPhasesOnTheStream) {
  const fs::path path = fs::temp_directory_path() /
                        ("gradsync_device_timeline_" + std::to_string(getpid()) + ".json");
  start_timeline(path.string());
  std::vector<std::unique_ptr<HostTensor>> group;
  std::vector<TensorView> views;
  GroupedAllreduceOptions group_options;
  for (int i = 0; i < 4; ++i) {
    group.push_back(std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{100}));
    for (int64_t k = 0; k < 100; ++k) group.back()->Set(k, 1);
    views.push_back(OnDevice(group.back().get()));
    group_options.names.push_back("device.tl.group." + std::to_string(i));
  }
  HostTensor alone(DataType::kFloat32, {1000});
  for (int64_t k = 0; k < 1000; ++k) alone.Set(k, 2);
  AllreduceOptions alone_options;
  alone_options.name = "device.tl.alone";
  alone_options.op = ReduceOp::kAverage;
  for (const Handle& h : grouped_allreduce(views, group_options)) ASSERT_TRUE(Succeeds(h));
  ASSERT_TRUE(Succeeds(allreduce(OnDevice(&alone), alone_options)));
  EXPECT_EQ(group[0]->Get(0), size_);
  EXPECT_EQ(alone.Get(0), 2);
  stop_timeline();
  if (rank_ != 0) return;

  const Trace trace = LoadTrace(path);
  fs::remove(path);
  ASSERT_TRUE(trace.ok);
  ExpectAllClosed(trace);
  auto names = [](const std::vector<Phase>& phases) {
    std::vector<std::string> out;
    for (const Phase& p : phases) out.push_back(p.name);
    return out;
  };
  auto expect_back_to_back = [](const std::vector<Phase>& phases) {
    for (size_t i = 1; i < phases.size(); ++i) {
      // Microseconds, rounded on each side.
      EXPECT_GE(phases[i].ts, phases[i - 1].ts + phases[i - 1].dur - 1) << phases[i].name;
    }
  };
  const std::vector<std::string> row = trace.Sequence(trace.RowOf("device.tl.group.2"));
  EXPECT_NE(std::find(row.begin(), row.end(), "B DEVICE_LAUNCH"), row.end());
  const std::vector<Phase> fused = PhasesOf(trace, "device.tl.group.2");
  EXPECT_EQ(names(fused), (std::vector<std::string>{"DEVICE_QUEUE", "DEVICE_COPY_IN",
                                                    "DEVICE_ALLREDUCE", "DEVICE_COPY_OUT"}));
  expect_back_to_back(fused);
  // In place, so no copy in; an average past one rank is scaled after the sum.
  const std::vector<Phase> lone = PhasesOf(trace, "device.tl.alone");
  std::vector<std::string> expected{"DEVICE_QUEUE", "DEVICE_ALLREDUCE"};
  if (size_ > 1) expected.push_back("DEVICE_SCALE");
  EXPECT_EQ(names(lone), expected);
  expect_back_to_back(lone);
}

// A trainer whose gradients are views into one flat buffer, laid out in the order it enqueues
// them (as DDP's bucket views are): every bucket, negotiated and then locked, is reduced where
// it lies, with no copy in or out, and every step's sums are right.
TEST_F(DeviceLoopTest, AFlatGradientBufferIsReducedWhereItLiesNegotiatedAndLocked) {
  const fs::path path =
      fs::temp_directory_path() / ("gradsync_device_flat_" + std::to_string(getpid()) + ".json");
  start_timeline(path.string());
  const std::vector<int64_t> counts{64, 4, 1000, 12, 4096, 7};
  int64_t elements = 0;
  for (int64_t n : counts) elements += n;
  HostTensor flat(DataType::kFloat32, {elements});
  for (int step = 0; step < 8; ++step) {
    std::vector<Handle> handles;
    int64_t at = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      for (int64_t k = 0; k < counts[g]; ++k) flat.Set(at + k, rank_ + step + k % 3);
      TensorView view = OnDevice(&flat);
      view.data = static_cast<float*>(flat.data()) + at;
      view.shape = {counts[g]};
      AllreduceOptions options;
      options.name = "device.flat." + std::to_string(g);
      handles.push_back(allreduce(view, options));
      at += counts[g];
    }
    for (const Handle& h : handles) ASSERT_TRUE(Succeeds(h)) << "step " << step;
    at = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      for (int64_t k = 0; k < counts[g]; ++k) {
        const double expected = size_ * (size_ - 1) / 2.0 + size_ * (step + k % 3);
        ASSERT_EQ(flat.Get(at + k), expected) << "step " << step << " gradient " << g;
      }
      at += counts[g];
    }
  }
  stop_timeline();
  if (rank_ != 0) return;
  const Trace trace = LoadTrace(path);
  fs::remove(path);
  ASSERT_TRUE(trace.ok);
  EXPECT_EQ(LocksOfTheGlobalSet(trace), 1u) << "the loop locked";
  for (size_t g = 0; g < counts.size(); ++g) {
    const std::vector<Phase> phases = PhasesOf(trace, "device.flat." + std::to_string(g));
    EXPECT_EQ(phases.size(), 2u * 8) << "a queue and a collective each step, gradient " << g;
    for (const Phase& phase : phases) {
      EXPECT_TRUE(phase.name == "DEVICE_QUEUE" || phase.name == "DEVICE_ALLREDUCE")
          << phase.name << ", gradient " << g;
    }
  }
}

// An output rank 0 cannot allocate (its allocator gives no memory, or throws as a framework's
// out-of-memory error does) fails there alone, and only once the device is done with the input:
// the collective rank 0 still takes part in reads it until then, and a caller told of the failure
// may free it; synchronize_stream() reports the failure too, rather than ordering a consumer after
// the launch. The producer here holds the stream until the test opens it.
TEST_F(DeviceLoopTest, AnOutputThatCannotBeAllocatedFailsOnlyOnceTheDeviceIsDoneWithTheInput) {
  struct HostStreamReadiness {
    HostStreamReadiness() { SetReadinessRecorderForTesting(&RecordOnHostStream); }
    ~HostStreamReadiness() { SetReadinessRecorderForTesting(nullptr); }
  } recorder;
  HostStream producer;
  std::promise<void> open;
  producer.Enqueue([opened = open.get_future().share()] { opened.wait(); });
  const DeviceReadiness late{&producer, nullptr};
  const Allocator refuses = [](const std::vector<int64_t>&, DataType) -> void* { return nullptr; };
  const Allocator throws = [](const std::vector<int64_t>&, DataType) -> void* {
    throw std::runtime_error("out of memory");
  };
  HostTensor rows(DataType::kFloat32, {2 * size_});
  HostTensor more_rows(DataType::kFloat32, {3 * size_});
  for (HostTensor* t : {&rows, &more_rows}) {
    for (int64_t i = 0; i < t->size(); ++i) t->Set(i, rank_ + 1);
  }
  std::unique_ptr<HostTensor> gathered, sent, share, more_share;
  AllgatherOptions gather_options;
  gather_options.ready = late;
  Handle gather =
      allgather(OnDevice(&rows), rank_ == 0 ? refuses : Into(&gathered), gather_options);
  AlltoallOptions alltoall_options;
  alltoall_options.ready = late;
  Handle swap = alltoall(OnDevice(&rows), rank_ == 0 ? throws : Into(&sent), alltoall_options);
  // A fused bucket of two, the first of which fails on rank 0 alone.
  GroupedReducescatterOptions scatter_options;
  scatter_options.ready = late;
  std::vector<Handle> scatter = grouped_reducescatter(
      {OnDevice(&rows), OnDevice(&more_rows)},
      {rank_ == 0 ? refuses : Into(&share), Into(&more_share)}, scatter_options);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (const Handle* h : {&gather, &swap, &scatter[0], &scatter[1]}) {
    EXPECT_FALSE(h->poll()) << "completed while the producer still held the stream";
  }
  open.set_value();
  const int sum = size_ * (size_ + 1) / 2;
  ASSERT_TRUE(Succeeds(scatter[1]));
  EXPECT_EQ(more_share->Get(0), sum);
  if (rank_ == 0) {
    EXPECT_THROW(gather.synchronize_stream(nullptr), Error);
    EXPECT_TRUE(FailsWith(gather, StatusCode::kInvalidArgument, "allocator gave no memory"));
    EXPECT_TRUE(FailsWith(swap, StatusCode::kInvalidArgument, "it threw: out of memory"));
    EXPECT_TRUE(FailsWith(scatter[0], StatusCode::kInvalidArgument, "allocator gave no memory"));
  } else {
    for (const Handle* h : {&gather, &swap, &scatter[0]}) ASSERT_TRUE(Succeeds(*h));
    EXPECT_EQ(gathered->Get(0), 1);
    EXPECT_EQ(gathered->Get(gathered->size() - 1), size_);
    EXPECT_EQ(sent->Get(0), 1);
    EXPECT_EQ(share->Get(0), sum);
  }
}

TEST_F(DeviceLoopTest, ProcessSetsGetDevicePlanesOfTheirOwn) {
  if (size_ < 2) GTEST_SKIP() << "a set of every other rank is the global set at 1 rank";
  std::vector<int> evens;
  for (int q = 0; q < size_; q += 2) evens.push_back(q);
  ProcessSet set = add_process_set(evens);
  HostTensor in_set(DataType::kFloat32, {64});
  HostTensor global(DataType::kFloat32, {64});
  for (int64_t i = 0; i < 64; ++i) {
    in_set.Set(i, 1);
    global.Set(i, 1);
  }
  Handle h_set;
  if (set.included()) {
    AllreduceOptions options;
    options.process_set = set;
    options.name = "set.grad";
    h_set = allreduce(OnDevice(&in_set), options);
  }
  Handle h_global = allreduce(OnDevice(&global));
  ASSERT_TRUE(Succeeds(h_global));
  EXPECT_EQ(global.Get(0), size_);
  if (set.included()) {
    ASSERT_TRUE(Succeeds(h_set));
    EXPECT_EQ(in_set.Get(0), static_cast<float>(evens.size()));
  }
  remove_process_set(set);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
