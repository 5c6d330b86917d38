// Host streams and events: the ordering, stream-ordered completion, timeout and abort that the
// device data plane relies on, without a GPU.
#include "runtime/host_stream.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "test/unit/contending_event.h"

namespace gradsync {
namespace {

constexpr std::chrono::seconds kLong(30);  // only reached when the code under test is broken
constexpr std::chrono::milliseconds kShort(20);

TEST(HostStreamTest, RunsWorkInTheOrderGiven) {
  HostStream stream;
  std::vector<int> seen;
  for (int i = 0; i < 100; ++i) stream.Enqueue([&seen, i] { seen.push_back(i); });
  ASSERT_TRUE(stream.Record()->Wait(kLong).ok());
  ASSERT_EQ(100u, seen.size());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(i, seen[i]);
}

// A stand-in for a producer's readiness event, of a known stream or not.
class ProducerEvent : public StreamEvent {
 public:
  ProducerEvent(const void* source, uint64_t sequence) : source_(source), sequence_(sequence) {}
  bool Query() override { return true; }
  Status Wait(std::chrono::nanoseconds) override { return Status::OK(); }
  const void* source() const override { return source_; }
  uint64_t sequence() const override { return sequence_; }

 private:
  const void* source_;
  uint64_t sequence_;
};

// A bucket waits once per producer stream, for its latest event, and for every event whose
// stream is unknown (a caller's own event).
TEST(HostStreamTest, ABucketWaitsForTheLatestEventOfEachProducer) {
  int stream_a = 0, stream_b = 0;
  ProducerEvent a1(&stream_a, 1), b2(&stream_b, 2), a3(&stream_a, 3), a5(&stream_a, 5),
      b4(&stream_b, 4), own1(nullptr, 0), own2(nullptr, 0);
  const std::vector<StreamEvent*> waited =
      LatestPerSource({&a1, &b2, nullptr, &own1, &a5, &a3, &b4, &own2});
  EXPECT_EQ(waited, (std::vector<StreamEvent*>{&a5, &b4, &own1, &own2}));
  EXPECT_TRUE(LatestPerSource({}).empty());
  EXPECT_EQ(LatestPerSource({&a3}), (std::vector<StreamEvent*>{&a3}));
}

// The timeline draws a device bucket's phases from its events' completion times.
TEST(HostStreamTest, EventsTellWhenTheirWorkFinished) {
  HostStream stream;
  const auto before = std::chrono::steady_clock::now();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  stream.Enqueue([released] { released.wait(); });
  std::shared_ptr<StreamEvent> event = stream.RecordTimed();
  std::chrono::steady_clock::time_point at;
  EXPECT_FALSE(event->CompletedAt(&at));  // not yet run
  std::this_thread::sleep_for(kShort);
  const auto released_at = std::chrono::steady_clock::now();
  release.set_value();
  ASSERT_TRUE(event->Wait(kLong).ok());
  ASSERT_TRUE(event->CompletedAt(&at));
  EXPECT_GE(at, released_at);
  EXPECT_GE(at, before);
  EXPECT_LE(at, std::chrono::steady_clock::now());
  // A failed event has no completion time to show.
  stream.Abort(Status::Timeout("stuck"));
  std::shared_ptr<StreamEvent> failed = stream.Record();
  failed->Wait(kLong);
  EXPECT_FALSE(failed->CompletedAt(&at));
}

// A consumer stream reads a tensor only after its producer finished writing it, and neither the
// wait nor the enqueue holds up the caller: everything below is enqueued while the producer is
// still blocked.
TEST(HostStreamTest, ConsumerWaitsOnTheProducersEventNotTheCaller) {
  HostStream producer, consumer;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  int tensor = 0;
  int read = -1;
  producer.Enqueue([&] {
    released.wait();
    tensor = 42;
  });
  consumer.WaitFor(producer.Record());
  consumer.Enqueue([&] { read = tensor; });
  std::shared_ptr<StreamEvent> done = consumer.Record();
  EXPECT_FALSE(done->Query());
  EXPECT_EQ(StatusCode::kTimeout, done->Wait(kShort).code());
  release.set_value();
  ASSERT_TRUE(done->Wait(kLong).ok());
  EXPECT_EQ(42, read);
}

// Stream-ordered completion: the framework's stream waits on the reduction's event, so its next
// work sees the result without the host waiting on anything.
TEST(HostStreamTest, FrameworkStreamOrderedAfterTheReduction) {
  HostStream communication, framework;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  int gradient = 1;
  int used = 0;
  communication.Enqueue([&] {
    released.wait();
    gradient = 7;  // the reduced value
  });
  framework.WaitFor(communication.Record());
  framework.Enqueue([&] { used = gradient; });
  std::shared_ptr<StreamEvent> step = framework.Record();
  release.set_value();
  ASSERT_TRUE(step->Wait(kLong).ok());
  EXPECT_EQ(7, used);
}

// An operation stuck behind a producer that never finishes: the wait times out, and aborting the
// stream fails the operation's event and every later one, running none of the dropped work.
TEST(HostStreamTest, AbortFailsWhatIsStuckAndEverythingAfter) {
  HostEvent never;
  HostStream communication;
  bool ran = false;
  communication.WaitFor(std::shared_ptr<StreamEvent>(&never, [](StreamEvent*) {}));
  communication.Enqueue([&] { ran = true; });
  std::shared_ptr<StreamEvent> stuck = communication.Record();
  EXPECT_EQ(StatusCode::kTimeout, stuck->Wait(kShort).code());

  communication.Abort(Status::Timeout("allreduce of 'w' did not finish within 1 s"));
  const Status failed = stuck->Wait(kLong);
  EXPECT_EQ(StatusCode::kTimeout, failed.code());
  EXPECT_NE(std::string::npos, failed.ToString().find("allreduce of 'w'")) << failed.ToString();
  communication.Enqueue([&] { ran = true; });
  const Status later = communication.Record()->Wait(kLong);
  EXPECT_EQ(failed.ToString(), later.ToString());
  EXPECT_FALSE(ran);
  never.Complete(Status::OK());  // released only now: the stream must not run the dropped work
  EXPECT_FALSE(ran);
}

// Work behind a wait for an event that failed (another stream's abort, a device's error) would
// read what the failed work left: the stream fails with the event's status and runs none of it,
// whether the event is another host stream's or a device's.
TEST(HostStreamTest, AFailedEventWaitedForFailsTheStream) {
  for (const bool device : {false, true}) {
    std::shared_ptr<StreamEvent> failed;
    HostStream producer;
    if (device) {
      failed = std::make_shared<ContendingEvent>(std::chrono::steady_clock::now() + kShort,
                                                 Status::Internal("an illegal memory access"));
    } else {
      producer.Enqueue([] { std::this_thread::sleep_for(kShort); });
      failed = producer.Record();
      producer.Abort(Status::Internal("an illegal memory access"));
    }
    HostStream consumer;
    bool ran = false;
    consumer.WaitFor(failed);
    consumer.Enqueue([&] { ran = true; });
    const Status after = consumer.Record()->Wait(kLong);
    EXPECT_EQ(StatusCode::kInternal, after.code()) << after.ToString();
    EXPECT_NE(std::string::npos, after.message().find("an illegal memory access"))
        << after.ToString();
    EXPECT_FALSE(ran) << (device ? "device" : "host") << " event";
    consumer.Enqueue([&] { ran = true; });
    EXPECT_EQ(StatusCode::kInternal, consumer.Record()->Wait(kLong).code());
    EXPECT_FALSE(ran);
  }
}

// An aborted stream refuses new work at once, but the item its thread is inside runs on: its
// owner looks at running() before it frees what that item uses.
TEST(HostStreamTest, RunningTellsWhetherTheThreadIsInsideAnItem) {
  HostStream stream;
  EXPECT_FALSE(stream.running());
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  stream.Enqueue([&entered, released] {
    entered.set_value();
    released.wait();
  });
  entered.get_future().wait();
  stream.Abort(Status::Timeout("stuck"));
  EXPECT_EQ(StatusCode::kTimeout, stream.Record()->Wait(kLong).code());
  EXPECT_TRUE(stream.running());
  release.set_value();
  const auto limit = std::chrono::steady_clock::now() + kLong;
  while (stream.running() && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
  EXPECT_FALSE(stream.running());
}

// A waiter looks for the completion for a while before it sleeps: completed during those looks or
// after, it returns the status; a limit shorter than the looks still ends the wait on time.
TEST(HostStreamTest, AWaiterSeesTheCompletionPolledOrAsleep) {
  for (const auto complete_after :
       {std::chrono::microseconds(10), std::chrono::microseconds(20000)}) {
    HostEvent event;
    std::thread completer([&] {
      std::this_thread::sleep_for(complete_after);
      event.Complete(Status::Shutdown("the stream was destroyed"));
    });
    EXPECT_EQ(StatusCode::kShutdown, event.Wait(kLong).code());
    completer.join();
  }
  HostEvent never;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(StatusCode::kTimeout, never.Wait(std::chrono::microseconds(20)).code());
  EXPECT_EQ(StatusCode::kTimeout, never.Wait(std::chrono::nanoseconds(0)).code());
  EXPECT_LT(std::chrono::steady_clock::now() - start, kLong);
}

// The longest limit there is waits for the completion: the deadline is clamped where the clock
// can hold it, not wrapped into the past (which timed out at once).
TEST(HostStreamTest, AWaitWithTheLongestLimitWaitsForTheCompletion) {
  HostEvent event;
  std::thread completer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    event.Complete(Status::OK());
  });
  EXPECT_TRUE(event.Wait(std::chrono::nanoseconds::max()).ok());
  completer.join();
}

TEST(HostStreamTest, DestroyingAStreamCompletesItsPendingEvents) {
  HostEvent never;
  std::shared_ptr<StreamEvent> pending;
  {
    HostStream stream;
    stream.WaitFor(std::shared_ptr<StreamEvent>(&never, [](StreamEvent*) {}));
    pending = stream.Record();
  }
  EXPECT_EQ(StatusCode::kShutdown, pending->Wait(kLong).code());
}

// The MPI backend's stream waiting for a producer's kernels: the device event's query contends
// with launches, so the stream looks at it no more often than QueryPacer allows (waits of 2 ms
// slices each began again with looks 20 us apart), and runs what follows once it completes.
TEST(HostStreamTest, ADeviceEventIsLookedAtPaced) {
  HostStream stream;
  const auto done_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  auto producer = std::make_shared<ContendingEvent>(done_at);
  stream.WaitFor(producer);
  std::shared_ptr<StreamEvent> after = stream.Record();
  ASSERT_TRUE(after->Wait(kLong).ok());
  std::chrono::steady_clock::time_point completed;
  ASSERT_TRUE(after->CompletedAt(&completed));
  EXPECT_GE(completed, done_at);
  const auto queries = producer->queries();
  ASSERT_FALSE(queries.empty());
  // About 80 looks in 20 ms; the stream began its wait no later than its first look.
  EXPECT_LE(queries.size(), 100u);
  EXPECT_LE(LooksSoonerThanPaced(queries, queries.front(), kProducerGap), 3)
      << "of " << queries.size();
}

// A stream stuck on a device event that never completes is released by an abort and by its
// destructor, between its looks.
TEST(HostStreamTest, AnAbortOrTheDestructorEndsAWaitForADeviceEvent) {
  const auto never = std::chrono::steady_clock::now() + std::chrono::hours(1);
  for (const bool abort : {true, false}) {
    auto producer = std::make_shared<ContendingEvent>(never);
    bool ran = false;
    std::chrono::steady_clock::time_point released;
    {
      HostStream stream;
      stream.WaitFor(producer);
      stream.Enqueue([&] { ran = true; });
      std::this_thread::sleep_for(kShort);  // past the looks a yield apart, into the sleeps
      if (abort) stream.Abort(Status::Timeout("the producer did not finish"));
      released = std::chrono::steady_clock::now();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - released, kLong);
    EXPECT_FALSE(ran);
    EXPECT_FALSE(producer->queries().empty());
  }
}

}  // namespace
}  // namespace gradsync
