#include "coordinator/finalizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/host_stream.h"
#include "test/unit/contending_event.h"

namespace gradsync {
namespace {

using std::chrono::milliseconds;

// A device plane reduced to what the finalizer uses: its events, its asynchronous error and its
// abort, which fails every event it handed out.
class FakePlane : public DataPlane {
 public:
  Status Allreduce(const std::vector<TensorEntry*>&, const ReduceSpec&) override { return {}; }
  Status Allgather(TensorEntry*, const std::vector<int64_t>&) override { return {}; }
  Status Broadcast(TensorEntry*, int) override { return {}; }
  Status Reducescatter(const std::vector<TensorEntry*>&, const ReduceSpec&,
                       std::vector<LocalFailure>*) override {
    return {};
  }
  Status Alltoall(TensorEntry*) override { return {}; }
  std::chrono::nanoseconds completion_timeout() const override { return timeout; }
  Status CheckAsyncError() override {
    std::lock_guard<std::mutex> lock(mu);
    return async_error;
  }
  void Abort(const Status& status) override {
    aborts++;
    for (auto& event : events) event->Complete(status);
  }

  std::shared_ptr<HostEvent> NewEvent() {
    events.push_back(std::make_shared<HostEvent>());
    return events.back();
  }

  std::chrono::nanoseconds timeout = std::chrono::hours(1);
  std::mutex mu;
  Status async_error;
  std::atomic<int> aborts{0};
  std::vector<std::shared_ptr<HostEvent>> events;
};

struct Completions {
  std::mutex mu;
  std::vector<std::pair<std::string, Status>> seen;

  Finalizer::CompleteFn Fn() {
    return [this](const std::vector<TensorEntry*>& entries, const Status& status) {
      std::lock_guard<std::mutex> lock(mu);
      for (TensorEntry* entry : entries) seen.emplace_back(entry->name, status);
    };
  }
};

std::unique_ptr<TensorEntry> Entry(const std::string& name) {
  auto entry = std::make_unique<TensorEntry>();
  entry->name = name;
  entry->state = std::make_shared<OpState>();
  return entry;
}

TEST(FinalizerTest, CompletesABucketWhenItsEventDoes) {
  Completions done;
  FakePlane plane;
  Finalizer finalizer(done.Fn());
  auto a = Entry("a");
  auto b = Entry("b");
  auto event = plane.NewEvent();
  finalizer.Add(&plane, 0, {a.get(), b.get()}, event);
  EXPECT_EQ(finalizer.pending(), 1u);
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(done.seen.empty()) << "completed before its event";
  event->Complete(Status::OK());
  finalizer.Drain();
  ASSERT_EQ(done.seen.size(), 2u);
  EXPECT_EQ(done.seen[0].first, "a");
  EXPECT_TRUE(done.seen[1].second.ok());
  EXPECT_EQ(finalizer.pending(), 0u);
}

TEST(FinalizerTest, AFailedEventFailsItsBucket) {
  Completions done;
  FakePlane plane;
  Finalizer finalizer(done.Fn());
  auto a = Entry("a");
  auto event = plane.NewEvent();
  finalizer.Add(&plane, 0, {a.get()}, event);
  event->Complete(Status(StatusCode::kCudaError, "ncclSystemError"));
  finalizer.Drain();
  ASSERT_EQ(done.seen.size(), 1u);
  EXPECT_EQ(done.seen[0].second.code(), StatusCode::kCudaError);
}

// A tensor that failed on this rank alone completes with its own status, but only once the launch
// it took part in has run: the device reads its input until then.
TEST(FinalizerTest, ALocalFailureCompletesWithItsOwnStatusOnceTheLaunchHasRun) {
  Completions done;
  FakePlane plane;
  Finalizer finalizer(done.Fn());
  auto failed = Entry("failed");
  auto fine = Entry("fine");
  auto event = plane.NewEvent();
  const Status no_memory = Status::InvalidArgument("the output allocator gave no memory");
  finalizer.AddLocalFailures(&plane, 0, {{failed.get(), no_memory}}, event);
  finalizer.Add(&plane, 0, {fine.get()}, event);
  EXPECT_EQ(finalizer.pending(), 2u);
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(done.seen.empty()) << "completed before the launch had run";
  event->Complete(Status::OK());
  finalizer.Drain();
  ASSERT_EQ(done.seen.size(), 2u);
  EXPECT_EQ(done.seen[0].first, "failed");
  EXPECT_EQ(done.seen[0].second.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(done.seen[1].first, "fine");
  EXPECT_TRUE(done.seen[1].second.ok());
}

TEST(FinalizerTest, ALateBucketAbortsItsPlaneOnceNamingItsTensors) {
  Completions done;
  FakePlane plane;
  plane.timeout = milliseconds(100);
  Finalizer finalizer(done.Fn());
  std::vector<std::unique_ptr<TensorEntry>> entries;
  std::vector<TensorEntry*> bucket;
  for (const char* name : {"w1", "w2", "w3", "w4", "w5"}) {
    entries.push_back(Entry(name));
    bucket.push_back(entries.back().get());
  }
  auto later = Entry("later");
  finalizer.Add(&plane, 2, bucket, plane.NewEvent());
  finalizer.Add(&plane, 2, {later.get()}, plane.NewEvent());
  finalizer.Drain();
  EXPECT_EQ(plane.aborts.load(), 1);
  ASSERT_EQ(done.seen.size(), 6u);
  for (const auto& [name, status] : done.seen) {
    EXPECT_EQ(status.code(), StatusCode::kTimeout) << name;
    EXPECT_NE(status.message().find("allreduce of tensors 'w1', 'w2', 'w3' and 2 more"),
              std::string::npos)
        << status.message();
    EXPECT_NE(status.message().find("process set 2"), std::string::npos);
  }
}

// A bucket still on the device after the warning period is logged, and again every period, even
// with the timeout off: nothing else watches work whose negotiation is over.
TEST(FinalizerTest, ABucketStillOnTheDeviceIsWarnedOfEveryPeriod) {
  Completions done;
  FakePlane plane;
  plane.timeout = std::chrono::nanoseconds::max();  // GRADSYNC_NCCL_TIMEOUT_SECONDS=0
  Finalizer finalizer(done.Fn());
  finalizer.set_slow_warning(milliseconds(50));
  auto entry = Entry("slow");
  const std::shared_ptr<HostEvent> event = plane.NewEvent();
  finalizer.Add(&plane, 0, {entry.get()}, event);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (finalizer.slow_warnings() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_GE(finalizer.slow_warnings(), 2u);
  event->Complete(Status::OK());
  finalizer.Drain();
  ASSERT_EQ(done.seen.size(), 1u);
  EXPECT_TRUE(done.seen[0].second.ok());
}

TEST(FinalizerTest, AnAsynchronousErrorAbortsThePlane) {
  Completions done;
  FakePlane plane;
  Finalizer finalizer(done.Fn());
  auto a = Entry("a");
  finalizer.Add(&plane, 0, {a.get()}, plane.NewEvent());
  {
    std::lock_guard<std::mutex> lock(plane.mu);
    plane.async_error = Status(StatusCode::kCudaError, "NCCL reported unhandled system error");
  }
  finalizer.Drain();
  EXPECT_EQ(plane.aborts.load(), 1);
  ASSERT_EQ(done.seen.size(), 1u);
  EXPECT_NE(done.seen[0].second.message().find("unhandled system error"), std::string::npos);
}

// An event whose Query() blocks until released, as a query into a busy driver may.
class StuckQueryEvent : public StreamEvent {
 public:
  bool Query() override {
    std::unique_lock<std::mutex> lock(mu_);
    querying_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return released_; });
    return true;
  }
  Status Wait(std::chrono::nanoseconds) override { return Status::OK(); }
  void AwaitQuery() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return querying_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool querying_ = false;
  bool released_ = false;
};

// The thread that launches the next bucket (a caller, in a locked step) hands it over while the
// finalizer is inside a query of the device: the hand-over must not wait for that query.
TEST(FinalizerTest, AddDoesNotWaitForAQueryInProgress) {
  Completions done;
  FakePlane plane;
  Finalizer finalizer(done.Fn());
  auto stuck_entry = Entry("stuck");
  auto next = Entry("next");
  auto stuck = std::make_shared<StuckQueryEvent>();
  finalizer.Add(&plane, 0, {stuck_entry.get()}, stuck);
  stuck->AwaitQuery();
  std::atomic<bool> handed_over{false};
  std::thread launcher([&] {
    finalizer.Add(&plane, 0, {next.get()}, plane.NewEvent());
    handed_over = true;
  });
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!handed_over && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_TRUE(handed_over.load()) << "Add waited for the finalizer's query of another event";
  stuck->Release();
  launcher.join();
  plane.events.back()->Complete(Status::OK());
  finalizer.Drain();
  ASSERT_EQ(done.seen.size(), 2u);
  EXPECT_EQ(done.seen[0].first, "stuck");
  EXPECT_EQ(done.seen[1].first, "next");
}

// The finalizer keeps to the pacer's gaps with such an event, and still completes its bucket.
TEST(FinalizerTest, AContendingEventIsLookedAtLessOftenTheLongerItRuns) {
  Completions done;
  FakePlane plane;
  Finalizer finalizer(done.Fn());
  auto entry = Entry("slow");
  const auto before_add = std::chrono::steady_clock::now();
  auto event = std::make_shared<ContendingEvent>(before_add + milliseconds(20));
  finalizer.Add(&plane, 0, {entry.get()}, event);
  const auto added = std::chrono::steady_clock::now();  // no earlier than the finalizer's
  finalizer.Drain();
  ASSERT_EQ(done.seen.size(), 1u);
  EXPECT_TRUE(done.seen[0].second.ok());
  const auto queries = event->queries();
  // QueryPacerTest's count for 20 ms in flight is about 160; a loop that looked at every turn
  // would have made thousands.
  EXPECT_LE(queries.size(), 200u);
  const int too_soon = LooksSoonerThanPaced(queries, added);
  EXPECT_LE(too_soon, 3) << "of " << queries.size() << " looks";
}

// A host event that tells of its completion, and notes when it completed and when it was queried.
class TellingEvent : public StreamEvent {
 public:
  bool Query() override {
    const bool done = event_.Query();
    std::lock_guard<std::mutex> lock(mu_);
    queries_.push_back(std::chrono::steady_clock::now());
    return done;
  }
  Status Wait(std::chrono::nanoseconds timeout) override { return event_.Wait(timeout); }
  bool NotifyOnCompletion(const std::shared_ptr<CompletionListener>& listener) override {
    return event_.NotifyOnCompletion(listener);
  }
  void Complete() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_at_ = std::chrono::steady_clock::now();
    }
    event_.Complete(Status::OK());
  }
  std::chrono::steady_clock::time_point completed_at() {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_at_;
  }
  std::vector<std::chrono::steady_clock::time_point> queries() {
    std::lock_guard<std::mutex> lock(mu_);
    return queries_;
  }

 private:
  HostEvent event_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point completed_at_;
  std::vector<std::chrono::steady_clock::time_point> queries_;
};

// Past its first looks, the finalizer sleeps through a bucket whose event tells of its completion
// and is woken by it: few looks, and the completion seen at once. Polled after pauses that double
// up to a millisecond, each of these buckets would be looked at about 20 times and seen up to a
// millisecond late; sleeping until the next error poll without being woken, up to 10 ms late.
// Looks are counted from the finalizer's first look, not from Add: on a loaded machine its thread
// may start milliseconds after the bucket arrived, and its first looks all come together then.
TEST(FinalizerTest, AnEventThatTellsOfItsCompletionWakesTheFinalizer) {
  FakePlane plane;
  std::mutex mu;
  std::vector<std::chrono::steady_clock::time_point> seen_at;
  Finalizer finalizer([&](const std::vector<TensorEntry*>&, const Status&) {
    std::lock_guard<std::mutex> lock(mu);
    seen_at.push_back(std::chrono::steady_clock::now());
  });
  constexpr int kBuckets = 9;
  std::vector<double> late_ms;
  size_t later_looks = 0;
  for (int b = 0; b < kBuckets; ++b) {
    auto entry = Entry("telling" + std::to_string(b));
    auto event = std::make_shared<TellingEvent>();
    const auto added = std::chrono::steady_clock::now();
    finalizer.Add(&plane, 0, {entry.get()}, event);
    // Offsets spread over the finalizer's 10 ms between error polls.
    std::this_thread::sleep_until(added + std::chrono::microseconds(15000 + 1100 * b));
    event->Complete();
    finalizer.Drain();
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(seen_at.size(), static_cast<size_t>(b + 1));
    late_ms.push_back(
        std::chrono::duration<double, std::milli>(seen_at.back() - event->completed_at()).count());
    const auto looks = event->queries();
    ASSERT_FALSE(looks.empty());
    for (const auto& at : looks) later_looks += at - looks.front() > milliseconds(2) ? 1 : 0;
  }
  std::sort(late_ms.begin(), late_ms.end());
  EXPECT_LT(late_ms[kBuckets / 2], 2.5) << "median ms from completion to the finalizer's";
  EXPECT_LE(later_looks, 8u * kBuckets) << "looks later than 2 ms after each bucket's first";
}

// Buckets handed over `gap` apart, each already complete, with an event like a device's (only a
// query shows it complete) or, `telling`, like a host stream's (it tells of its completion);
// returns how many of them found the finalizer asleep and had to wake it. Paced against a clock, so
// that a late hand-over is followed by an early one rather than by every later one running late.
size_t WakeupsForBucketsEvery(std::chrono::microseconds gap, int buckets, bool telling,
                              std::chrono::microseconds longest = std::chrono::microseconds(1000)) {
  Completions done;
  FakePlane plane;
  // The finalizer's own bounds (`longest`: its longest window), but no yield counts as the core
  // wanted: on a loaded machine (the suite runs tests side by side) yields return late, and the
  // finalizer would rightly sleep.
  Finalizer finalizer(done.Fn(), nullptr,
                      SpinWindow(std::chrono::microseconds(100), longest, std::chrono::hours(1)));
  std::vector<std::unique_ptr<TensorEntry>> entries;
  const auto start = std::chrono::steady_clock::now();
  for (int b = 0; b < buckets; ++b) {
    while (std::chrono::steady_clock::now() < start + b * gap) std::this_thread::yield();
    entries.push_back(Entry("b" + std::to_string(b)));
    std::shared_ptr<StreamEvent> event;
    if (telling) {
      auto host = plane.NewEvent();
      host->Complete(Status::OK());
      event = host;
    } else {
      event = std::make_shared<ContendingEvent>(std::chrono::steady_clock::now());
    }
    finalizer.Add(&plane, 0, {entries.back().get()}, event);
  }
  finalizer.Drain();
  EXPECT_EQ(done.seen.size(), static_cast<size_t>(buckets));
  return finalizer.sleeping_wakeups();
}

constexpr int kPacedBuckets = 24;

// A host-bound backward launches its buckets a few hundred microseconds apart: the finalizer,
// having seen them come that far apart, stays awake between them, so that the caller launching
// the next one does not pay a system call to wake it. With a fixed window of 100 us nearly every
// one of these would wake it (22 of 24 on a 2-core VM). A loaded machine only lowers the count
// (the finalizer, kept from its core, finds the next bucket there before it could sleep), and so
// does not make this fail; a try in which the test's own thread was kept from its core for longer
// than the window may, so up to three are made.
TEST(FinalizerTest, BucketsArrivingAFewHundredMicrosecondsApartFindItAwake) {
  std::vector<size_t> seen;
  for (int attempt = 0; attempt < 3; ++attempt) {
    seen.push_back(WakeupsForBucketsEvery(std::chrono::microseconds(250), kPacedBuckets, false));
    if (seen.back() <= kPacedBuckets / 4) return;
  }
  ADD_FAILURE() << "wake-ups of " << kPacedBuckets
                << " buckets 250 us apart, in each try: " << seen[0] << ", " << seen[1] << ", "
                << seen[2];
}

// Buckets whose events tell of their completion find it asleep even a few hundred microseconds
// apart: a host thread runs those and needs a core for it (400 us apart, a widened window would
// span the gaps). Seeing a sleep needs the finalizer's thread to get a core within the gap, which a
// loaded machine may not give it; so each try first measures the same buckets with a finalizer
// whose window cannot widen: where that one is not seen asleep either, the try says nothing. Up to
// five tries; where fewer than two could tell, the test is skipped.
TEST(FinalizerTest, BucketsThatTellOfTheirCompletionFindItAsleep) {
  const auto gap = std::chrono::microseconds(400);
  std::string tries;
  int observable = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(milliseconds(10));
    const size_t narrow = WakeupsForBucketsEvery(gap, kPacedBuckets, /*telling=*/true,
                                                 /*longest=*/std::chrono::microseconds(100));
    if (narrow < kPacedBuckets / 2) {
      tries += " (" + std::to_string(narrow) + " with no widening: loaded)";
      continue;
    }
    ++observable;
    const size_t telling = WakeupsForBucketsEvery(gap, kPacedBuckets, /*telling=*/true);
    if (telling >= kPacedBuckets / 2) return;
    tries += " (" + std::to_string(narrow) + " with no widening, " + std::to_string(telling) + ")";
  }
  // The load can change between a try's two measurements: one such try alone says nothing.
  if (observable < 2) GTEST_SKIP() << "the finalizer's thread seldom got a core in time:" << tries;
  ADD_FAILURE() << "wake-ups of " << kPacedBuckets << " buckets " << gap.count()
                << " us apart in each try:" << tries;
}

TEST(FinalizerTest, NoThreadUntilTheFirstBucket) {
  Completions done;
  { Finalizer unused(done.Fn()); }  // constructing and destroying one is free and immediate
  EXPECT_TRUE(done.seen.empty());
}

}  // namespace
}  // namespace gradsync
