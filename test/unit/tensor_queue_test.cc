// The tensor queue: push order, names in flight, release and reuse, batches, close, and many
// pushing threads (waiting for work, waking and pausing: tensor_queue_wait_test.cc).
#include "runtime/tensor_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/host_stream.h"
#include "runtime/thread_role.h"
#include "test/unit/tensor_queue_samples.h"

namespace gradsync {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

TEST(TensorQueueTest, DrainReturnsEntriesInPushOrder) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  ASSERT_TRUE(queue.Push(Entry("c")).ok());
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_TRUE(queue.Drain().empty());
  ASSERT_TRUE(queue.Push(Entry("d")).ok());
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"d"}));
}

TEST(TensorQueueTest, NullEntryIsRejected) {
  TensorQueue queue;
  EXPECT_EQ(queue.Push(nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<std::unique_ptr<TensorEntry>> batch;
  batch.push_back(Entry("a"));
  batch.push_back(nullptr);
  EXPECT_EQ(queue.PushAll(std::move(batch)).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(queue.Push(Entry("a")).ok());
}

TEST(TensorQueueTest, DuplicateNameIsRejectedWhileInFlight) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("grad.w")).ok());
  Status status = queue.Push(Entry("grad.w"));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "tensor name 'grad.w' is already in flight; names must be unique until the operation "
            "completes");
  // Draining hands the entry to the background thread, but the name stays in flight.
  EXPECT_EQ(queue.Drain().size(), 1u);
  EXPECT_EQ(queue.Push(Entry("grad.w")).code(), StatusCode::kInvalidArgument);
}

// Stands for a device operation's completion event; these tests never ask it anything.
class NeverAskedEvent : public StreamEvent {
 public:
  bool Query() override { return false; }
  Status Wait(std::chrono::nanoseconds) override { return Status::OK(); }
};

// A name whose operation was launched and ordered on a stream comes back with the next step while
// the device may still run it: the push waits for the completion instead of failing.
TEST(TensorQueueTest, NameOfALaunchedOperationIsAcceptedOnceItCompletes) {
  TensorQueue queue;
  auto first = Entry("grad.w");
  first->state->SetLaunched(std::make_shared<NeverAskedEvent>());
  ASSERT_TRUE(queue.Push(std::move(first)).ok());
  const std::vector<TensorEntry*> running = queue.Drain();
  std::atomic<bool> pushed{false};
  Status second;
  std::thread next_step([&] {
    second = queue.Push(Entry("grad.w"));
    pushed = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(pushed.load());
  queue.Release(running);
  next_step.join();
  EXPECT_TRUE(second.ok()) << second.ToString();
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"grad.w"}));
}

TEST(TensorQueueTest, CloseEndsAWaitForALaunchedName) {
  TensorQueue queue;
  auto first = Entry("grad.w");
  first->state->SetLaunched(std::make_shared<NeverAskedEvent>());
  ASSERT_TRUE(queue.Push(std::move(first)).ok());
  Status second;
  std::thread next_step([&] { second = queue.PushAll(Entries({"grad.b", "grad.w"})); });
  std::this_thread::sleep_for(milliseconds(20));
  queue.Close(Status::Stalled("rank 1 never submitted 'grad.w'"));
  next_step.join();
  EXPECT_EQ(second.code(), StatusCode::kStalled);
}

// A completion callback that enqueues a name whose device operation is still running would wait
// for a completion that its own thread has to deliver: it fails at once instead.
TEST(TensorQueueTest, GradsyncsOwnThreadsDoNotWaitForALaunchedName) {
  TensorQueue queue;
  auto first = Entry("grad.w");
  first->state->SetLaunched(std::make_shared<NeverAskedEvent>());
  ASSERT_TRUE(queue.Push(std::move(first)).ok());
  Status alone, batched;
  std::thread callback([&] {
    MarkBackgroundThread();
    alone = queue.Push(Entry("grad.w"));
    batched = queue.PushAll(Entries({"grad.b", "grad.w"}));
  });
  const auto started = steady_clock::now();
  callback.join();
  EXPECT_LT(steady_clock::now() - started, milliseconds(5000));
  EXPECT_EQ(alone.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(alone.message().find("cannot wait for it to complete"), std::string::npos)
      << alone.ToString();
  EXPECT_EQ(batched.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"grad.w"}));  // the first alone
}

TEST(TensorQueueTest, NameIsAcceptedAgainAfterRelease) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("grad.w")).ok());
  queue.Release(queue.Drain());
  EXPECT_TRUE(queue.Push(Entry("grad.w")).ok());
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"grad.w"}));
}

TEST(TensorQueueTest, ReleasingAnEntryNotInFlightIsHarmless) {
  TensorQueue queue;
  auto stranger = Entry("never-pushed");
  queue.Release({stranger.get()});
  EXPECT_TRUE(queue.Push(Entry("never-pushed")).ok());
  // Not even when an entry of the same name is in flight, released along with one that is.
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  std::vector<TensorEntry*> drained = queue.Drain();
  auto namesake = Entry("a");
  namesake->name_hash = HashName("a");  // as if pushed: it finds the in-flight "a" by name
  queue.Release({namesake.get(), drained[2]});
  EXPECT_EQ(Names(queue.InFlight()), (std::vector<std::string>{"never-pushed", "a"}));
}

TEST(TensorQueueTest, ReleasingEverythingInFlightAtOnceFreesEveryName) {
  TensorQueue queue;
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(queue.Push(Entry(name)).ok());
  std::vector<TensorEntry*> drained = queue.Drain();
  std::reverse(drained.begin(), drained.end());
  queue.Release(drained);
  EXPECT_TRUE(queue.InFlight().empty());
  queue.Recycle();
  for (const char* name : {"c", "a", "b"}) EXPECT_TRUE(queue.Push(Entry(name)).ok()) << name;
  EXPECT_EQ(queue.InFlight().size(), 3u);
}

// As many entries as are in flight, but not the same ones: only those in flight may be released.
TEST(TensorQueueTest, ReleasingAsManyEntriesAsAreInFlightReleasesOnlyThoseGiven) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("a")).ok());
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  std::vector<TensorEntry*> drained = queue.Drain();
  auto stranger = Entry("stranger");
  queue.Release({drained[0], stranger.get()});
  EXPECT_EQ(Names(queue.InFlight()), (std::vector<std::string>{"b"}));
  queue.Release({drained[0], drained[0], drained[1]});  // a repeated entry counts once
  EXPECT_TRUE(queue.InFlight().empty());
}

TEST(TensorQueueTest, ReleasedEntriesAreReusedCleared) {
  TensorQueue queue;
  auto entry = queue.NewEntry();
  // Every field away from its default, so a field that Clear() forgets fails below.
  float data[60];
  entry->name = "a.rather.long.gradient.name.that.does.not.fit.inline";
  entry->op = OpType::kAlltoall;
  entry->input = TensorView(data, DataType::kInt8, {3, 4, 5}, Device::Cuda(1));
  entry->output = TensorView(data, DataType::kInt64, {2}, Device::Cuda(2));
  entry->reduce_op = ReduceOp::kMax;
  entry->prescale = 2.0;
  entry->postscale = 3.0;
  entry->root = 3;
  entry->splits = {1, 2};
  const HostSegment pieces[1] = {{data, 60}};
  entry->segments = pieces;
  entry->segment_count = 1;
  entry->group = "group";
  entry->group_size = 2;
  entry->process_set = 4;
  entry->allocator = [](const std::vector<int64_t>&, DataType) { return nullptr; };
  entry->ready = std::make_shared<HostEvent>();
  entry->ready_stream = data;
  entry->waits_before = 7;
  entry->state = std::make_shared<OpState>();
  const TensorEntry* address = entry.get();
  const OpState* state = entry->state.get();
  const size_t name_capacity = entry->name.capacity();
  ASSERT_TRUE(queue.Push(std::move(entry)).ok());
  queue.Release(queue.Drain());
  EXPECT_EQ(queue.NewEntry()->name, "") << "an entry is pooled only by Recycle";
  queue.Recycle();

  auto reused = queue.NewEntry();
  const TensorEntry fresh;
  EXPECT_EQ(reused.get(), address);
  EXPECT_TRUE(reused->name.empty());
  EXPECT_GE(reused->name.capacity(), name_capacity);  // kept, so refilling does not allocate
  EXPECT_EQ(reused->op, fresh.op);
  for (const TensorView* view : {&reused->input, &reused->output}) {
    EXPECT_EQ(view->data, nullptr);
    EXPECT_EQ(view->dtype, fresh.input.dtype);
    EXPECT_TRUE(view->shape.empty());
    EXPECT_EQ(view->device, fresh.input.device);
  }
  EXPECT_EQ(reused->reduce_op, fresh.reduce_op);
  EXPECT_EQ(reused->prescale, fresh.prescale);
  EXPECT_EQ(reused->postscale, fresh.postscale);
  EXPECT_EQ(reused->root, fresh.root);
  EXPECT_TRUE(reused->splits.empty());
  EXPECT_EQ(reused->segments, nullptr);
  EXPECT_EQ(reused->segment_count, 0u);
  EXPECT_TRUE(reused->group.empty());
  EXPECT_EQ(reused->group_size, fresh.group_size);
  EXPECT_EQ(reused->process_set, fresh.process_set);
  EXPECT_FALSE(reused->allocator);
  EXPECT_EQ(reused->ready, nullptr);
  EXPECT_EQ(reused->ready_stream, nullptr);
  EXPECT_EQ(reused->waits_before, 0u);
  EXPECT_FALSE(reused->in_flight);
  EXPECT_EQ(reused->state.get(), state);       // kept for OpState::Renew
  EXPECT_NE(queue.NewEntry().get(), address);  // the pool is empty again: a new one
}

TEST(TensorQueueTest, PushAllAcceptsABatchInOrder) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("first")).ok());
  ASSERT_TRUE(queue.PushAll(Entries({"x", "y", "z"})).ok());
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"first", "x", "y", "z"}));
  EXPECT_EQ(queue.Push(Entry("y")).code(), StatusCode::kInvalidArgument);
}

TEST(TensorQueueTest, PushAllIsAtomicWhenOneNameIsInFlight) {
  TensorQueue queue;
  ASSERT_TRUE(queue.Push(Entry("b")).ok());
  Status status = queue.PushAll(Entries({"a", "b", "c"}));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'b'"), std::string::npos);
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"b"}));
  // Neither "a" nor "c" was left in flight by the rejected batch.
  EXPECT_TRUE(queue.Push(Entry("a")).ok());
  EXPECT_TRUE(queue.Push(Entry("c")).ok());
}

TEST(TensorQueueTest, PushAllRejectsDuplicatesWithinTheBatch) {
  TensorQueue queue;
  Status status = queue.PushAll(Entries({"a", "b", "a"}));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'a'"), std::string::npos);
  EXPECT_TRUE(queue.Drain().empty());
  EXPECT_TRUE(queue.PushAll(Entries({"a", "b"})).ok());
}

TEST(TensorQueueTest, EmptyBatchIsAccepted) {
  TensorQueue queue;
  EXPECT_TRUE(queue.PushAll({}).ok());
  EXPECT_TRUE(queue.Drain().empty());
}

TEST(TensorQueueTest, PushesFailWithTheCloseStatus) {
  TensorQueue queue;
  EXPECT_TRUE(queue.closed_status().ok());
  ASSERT_TRUE(queue.Push(Entry("before")).ok());
  queue.Close(Status::Stalled("rank 3 never submitted 'x'"));
  Status status = queue.Push(Entry("after"));
  EXPECT_EQ(status.code(), StatusCode::kStalled);
  EXPECT_EQ(status.message(), "rank 3 never submitted 'x'");
  EXPECT_EQ(queue.PushAll(Entries({"p", "q"})).code(), StatusCode::kStalled);
  EXPECT_EQ(queue.PushAll({}).code(), StatusCode::kStalled);
  EXPECT_EQ(queue.closed_status().code(), StatusCode::kStalled);
  // Entries accepted before the close are still handed over, so their handles can be failed.
  EXPECT_EQ(Names(queue.Drain()), (std::vector<std::string>{"before"}));
}

TEST(TensorQueueTest, FirstCloseReasonWins) {
  TensorQueue queue;
  queue.Close(Status::Stalled("first"));
  queue.Close(Status::Shutdown("second"));
  EXPECT_EQ(queue.closed_status().message(), "first");
}

TEST(TensorQueueTest, CloseWithOkStillRejectsPushes) {
  TensorQueue queue;
  queue.Close(Status::OK());
  EXPECT_EQ(queue.Push(Entry("a")).code(), StatusCode::kShutdown);
  EXPECT_FALSE(queue.closed_status().ok());
}

TEST(TensorQueueTest, ConcurrentPushersAreAllAccepted) {
  TensorQueue queue;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  std::vector<std::thread> pushers;
  for (int t = 0; t < kThreads; ++t) {
    pushers.emplace_back([&queue, t] {
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE(queue.Push(Entry("t" + std::to_string(t) + "." + std::to_string(i))).ok());
      }
    });
  }
  size_t drained = 0;
  const auto deadline = steady_clock::now() + kLongWait;
  while (drained < kThreads * kPerThread && steady_clock::now() < deadline) {
    queue.WaitForWork(milliseconds(10));
    drained += queue.Drain().size();
  }
  for (auto& pusher : pushers) pusher.join();
  EXPECT_EQ(drained, static_cast<size_t>(kThreads * kPerThread));
}

// A caller pushing while the completing thread releases and recycles the entries before it, as a
// locked step's buckets do: every push is accepted and every entry completed.
TEST(TensorQueueTest, PushesWhileEarlierEntriesAreReleasedAreAllAccepted) {
  TensorQueue queue;
  constexpr int kSteps = 50;
  constexpr int kPerStep = 64;
  std::atomic<int> completed{0};
  std::thread completer([&] {
    const auto deadline = steady_clock::now() + kLongWait;
    while (completed < kSteps * kPerStep && steady_clock::now() < deadline) {
      queue.WaitForWork(milliseconds(1));
      std::vector<TensorEntry*> drained = queue.Drain();
      queue.Release(drained);
      queue.Recycle();
      completed += static_cast<int>(drained.size());
    }
  });
  for (int step = 0; step < kSteps; ++step) {
    for (int t = 0; t < kPerStep; ++t) {
      std::unique_ptr<TensorEntry> entry = queue.NewEntry();
      entry->name = std::to_string(step) + "." + std::to_string(t);
      entry->state = std::make_shared<OpState>();
      EXPECT_TRUE(queue.Push(std::move(entry)).ok());
    }
  }
  completer.join();
  EXPECT_EQ(completed, kSteps * kPerStep);
}

}  // namespace
}  // namespace gradsync
