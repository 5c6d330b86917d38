// The locked schedule end to end: a training loop's steps lock after GRADSYNC_LOCK_AFTER_STEPS,
// and every way a rank can deviate afterwards (a new name on every rank, another shape on one
// rank, a tensor late on one rank, join, a process set added) leaves the lock on every rank with
// every result right or failed with negotiation's error, never a hang. Rank 0's timeline shows the
// LOCK and UNLOCK marks the checks count.
//
// With GRADSYNC_TEST_DEVICE_TENSORS=1 the tensors are device tensors over the host device backend
// (host memory labelled cuda:0), so that locked buckets are launched from the caller's thread
// (GRADSYNC_CALLER_LAUNCH); the backend notes which thread launched each allreduce.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "test/mpi/locked_schedule_fixture.h"

namespace gradsync {
namespace testing {
namespace {

TEST_F(LockedScheduleTest, ASteadyLoopLocksOnceAndStaysRight) {
  for (int step = 0; step < 12; ++step) RunStep(step);
  const std::vector<std::string> locks = Marks("LOCK set 0");
  const std::vector<std::string> unlocks = Marks("UNLOCK");
  if (rank_ != 0) return;
  if (!LockingOn()) {
    EXPECT_TRUE(locks.empty()) << "GRADSYNC_LOCKED_SCHEDULE=0 must keep negotiating";
    EXPECT_EQ(LockedWaits(), 0u);
    return;
  }
  ASSERT_EQ(locks.size(), 1u);
  EXPECT_TRUE(unlocks.empty()) << unlocks.front();
  // Locked by the ninth step at the latest: from then on every tensor waits for its bucket.
  EXPECT_GE(LockedWaits(), 3 * kSizes.size());
}

// Alone, a locked bucket needs nobody else: the push that fills it launches it on the caller's
// thread (unless the background thread is in a cycle just then), whether it pushed one tensor or
// a group of them, and GRADSYNC_CALLER_LAUNCH=0 leaves every launch to the background thread.
class LockedLaunchTest : public LockedScheduleTest,
                         public ::testing::WithParamInterface<bool /*grouped*/> {
 protected:
  void ExpectSingleLaunches(bool large_first);
};

// The launches noted since `from` of buckets of `kind`: how many, and how many on this thread.
struct LaunchCount {
  size_t launched = 0;
  size_t on_caller = 0;
};
enum class BucketKind { kAny, kFused, kAlone };

LaunchCount CountLaunches(size_t from, BucketKind kind) {
  std::lock_guard<std::mutex> lock(launches_mu);
  LaunchCount count;
  for (size_t i = from; i < launches.size(); ++i) {
    const bool fused = launches[i].tensors > 1;
    if (kind != BucketKind::kAny && fused != (kind == BucketKind::kFused)) continue;
    ++count.launched;
    count.on_caller += launches[i].thread == std::this_thread::get_id() ? 1 : 0;
  }
  return count;
}

size_t LaunchesSoFar() {
  std::lock_guard<std::mutex> lock(launches_mu);
  return launches.size();
}

TEST_P(LockedLaunchTest, LockedDeviceBucketsLaunchOnTheCallersThread) {
  if (!DeviceTensors()) GTEST_SKIP() << "host tensors: buckets run on the background thread";
  if (CallerLaunchMode() == CallerLaunch::kSingle) GTEST_SKIP() << "see the test after this";
  const bool grouped = GetParam();
  for (int step = 0; step < 6; ++step) RunStep(step, 0, grouped);  // locked by now
  const size_t before = LaunchesSoFar();
  for (int step = 6; step < 14; ++step) RunStep(step, 0, grouped);
  const LaunchCount count = CountLaunches(before, BucketKind::kAny);
  ASSERT_GT(count.launched, 0u);
  if (CallerLaunchMode() == CallerLaunch::kNone) {
    EXPECT_EQ(count.on_caller, 0u);
  } else if (LockingOn() && size_ == 1) {
    EXPECT_GE(2 * count.on_caller, count.launched)
        << count.on_caller << " of " << count.launched << " on the caller";
  }
}

// GRADSYNC_CALLER_LAUNCH=single: the caller launches a bucket of one tensor and leaves a fused
// one, whose batched copies would cost it, to the background thread. Run where the large tensor
// is reduced alone (GRADSYNC_INPLACE_THRESHOLD below its size) and the others share a bucket.
// Steps of both orders: the small ones, waited for, then the large one (so that its push finds
// the single-tensor bucket next); or the large one first and the rest straight after it (pushed
// as one group, the caller's cycle finds the fused bucket full behind the one it launches).
void LockedLaunchTest::ExpectSingleLaunches(bool large_first) {
  if (!DeviceTensors() || CallerLaunchMode() != CallerLaunch::kSingle) {
    GTEST_SKIP() << "for device tensors with GRADSYNC_CALLER_LAUNCH=single";
  }
  const bool grouped = GetParam();
  const size_t large = kSizes.size() - 1;
  auto step = [&](int s) {
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<TensorView> views;
    GroupedAllreduceOptions group;
    std::vector<Handle> handles;
    std::vector<size_t> order;
    if (large_first) order.push_back(large);
    for (size_t t = 0; t < large; ++t) order.push_back(t);
    for (size_t t : order) {
      tensors.push_back(Filled(kSizes[t], s + static_cast<int64_t>(t), rank_));
      views.push_back(View(*tensors.back()));
      group.names.push_back(Name(t));
      if (!grouped) handles.push_back(allreduce(views.back(), Named(Name(t))));
    }
    if (grouped) handles = grouped_allreduce(views, group);
    for (size_t i = 0; i < order.size(); ++i) {
      ASSERT_TRUE(Succeeds(handles[i])) << "step " << s << " " << Name(order[i]);
      ExpectSums(*tensors[i], s + static_cast<int64_t>(order[i]), 0, size_);
    }
    if (large_first) return;
    auto alone = Filled(kSizes[large], s + static_cast<int64_t>(large), rank_);
    ASSERT_TRUE(Succeeds(allreduce(View(*alone), Named(Name(large))))) << "step " << s;
    ExpectSums(*alone, s + static_cast<int64_t>(large), 0, size_);
  };
  for (int s = 0; s < 6; ++s) step(s);  // locked by now
  const size_t before = LaunchesSoFar();
  const auto started = std::chrono::steady_clock::now();
  for (int s = 6; s < 14; ++s) step(s);
  const auto took = std::chrono::steady_clock::now() - started;
  // Every push or cycle that leaves a bucket to the loop's thread wakes it: a step that waited for
  // the loop's own timer instead would take a cycle time, which the variant sets long (500 ms).
  Config config;
  ASSERT_TRUE(Config::FromEnvironment(&config).ok());
  if (config.cycle_time_ms >= 100) {
    const double steps = 8;  // half a cycle time each, at most
    const std::chrono::duration<double, std::milli> limit(steps * config.cycle_time_ms / 2);
    EXPECT_LT(took, limit) << "the loop's thread was left asleep with a bucket to run";
  }
  const LaunchCount fused = CountLaunches(before, BucketKind::kFused);
  const LaunchCount alone = CountLaunches(before, BucketKind::kAlone);
  ASSERT_GT(fused.launched, 0u) << "the small tensors were not fused";
  ASSERT_GT(alone.launched, 0u);
  EXPECT_EQ(fused.on_caller, 0u) << fused.on_caller << " of " << fused.launched;
  if (LockingOn() && size_ == 1) {
    EXPECT_GE(2 * alone.on_caller, alone.launched)
        << alone.on_caller << " of " << alone.launched << " on the caller";
  }
}

TEST_P(LockedLaunchTest, SingleLeavesFusedBucketsToTheBackgroundThread) {
  ExpectSingleLaunches(/*large_first=*/false);
}

TEST_P(LockedLaunchTest, SingleLeavesTheFusedBucketBehindItsOwnToTheBackgroundThread) {
  ExpectSingleLaunches(/*large_first=*/true);
}

INSTANTIATE_TEST_SUITE_P(Pushes, LockedLaunchTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Grouped" : "Single");
                         });

// Tensors given with their producer's stream, which writes them only after a while: the host runs
// ahead and every result is right. Unlocked, each enqueue records its own event; locked, the
// launch of a bucket records one for all of its tensors, whichever thread launches it.
TEST_F(LockedScheduleTest, LockedBucketsRecordOneReadinessEventPerProducerStream) {
  if (!DeviceTensors()) GTEST_SKIP() << "host tensors have no producer stream";
  HostStream producer;
  auto step_after_producer = [&](int step, std::chrono::milliseconds producer_delay) {
    std::vector<std::unique_ptr<HostTensor>> tensors;
    for (int64_t n : kSizes) {
      tensors.push_back(std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{n}));
      for (int64_t i = 0; i < n; ++i) tensors.back()->Set(i, -1000);  // until the producer runs
    }
    std::atomic<bool> produced{false};
    producer.Enqueue([&] {
      std::this_thread::sleep_for(producer_delay);
      for (size_t t = 0; t < kSizes.size(); ++t) {
        for (int64_t i = 0; i < kSizes[t]; ++i) {
          tensors[t]->Set(i, Value(ReduceOp::kSum, rank_, i + step + static_cast<int64_t>(t)));
        }
      }
      produced = true;
    });
    const int records_before = readiness_records.load();
    std::vector<Handle> handles;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      AllreduceOptions options = Named(Name(t));
      options.ready.cuda_stream = &producer;
      handles.push_back(allreduce(View(*tensors[t]), options));
    }
    if (producer_delay.count() > 0) {
      EXPECT_FALSE(produced) << "an enqueue waited for the producer";
    }
    for (size_t t = 0; t < kSizes.size(); ++t) {
      EXPECT_TRUE(Succeeds(handles[t])) << "step " << step << " " << Name(t);
      ExpectSums(*tensors[t], step + static_cast<int64_t>(t), 0, size_);
    }
    return readiness_records.load() - records_before;
  };
  const int tensors = static_cast<int>(kSizes.size());
  EXPECT_EQ(step_after_producer(0, std::chrono::milliseconds(300)), tensors);
  for (int step = 1; step < 8; ++step) step_after_producer(step, std::chrono::milliseconds(0));
  const size_t launches_before = LaunchesSoFar();
  int locked_records = step_after_producer(8, std::chrono::milliseconds(300));
  const int buckets = static_cast<int>(LaunchesSoFar() - launches_before);
  if (!LockingOn()) {
    EXPECT_EQ(locked_records, tensors) << "unlocked, every enqueue records its own";
    return;
  }
  // However many cycles took a bucket's tensors (the loop's thread, waking on its timer or
  // polling for an exchange, may take part of it), its launch records once.
  EXPECT_GE(locked_records, 1);
  EXPECT_LE(locked_records, buckets + 1) << "of " << tensors << " tensors in " << buckets;
}

// The calling thread's own default stream (cudaStreamPerThread) names another stream on any other
// thread: each enqueue given it records at once, on its own thread, even once the set has locked
// and the other streams' records wait for the cycle that takes the bucket.
TEST_F(LockedScheduleTest, ThePerThreadStreamIsRecordedByEachEnqueue) {
  if (!DeviceTensors()) GTEST_SKIP() << "host tensors have no producer stream";
  const int tensors = static_cast<int>(kSizes.size());
  for (int step = 0; step < 10; ++step) {
    {
      std::lock_guard<std::mutex> lock(per_thread_mu);
      per_thread_recorders.clear();
    }
    const int records_before = readiness_records.load();
    std::vector<std::unique_ptr<HostTensor>> data;
    std::vector<Handle> handles;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      data.push_back(Filled(kSizes[t], step + static_cast<int64_t>(t), rank_));
      AllreduceOptions options = Named(Name(t));
      options.ready.cuda_stream = PerThreadStreamHandle();
      handles.push_back(allreduce(View(*data.back()), options));
    }
    for (size_t t = 0; t < kSizes.size(); ++t) {
      ASSERT_TRUE(Succeeds(handles[t])) << "step " << step << " " << Name(t);
      ExpectSums(*data[t], step + static_cast<int64_t>(t), 0, size_);
    }
    EXPECT_EQ(readiness_records.load() - records_before, tensors) << "step " << step;
    std::lock_guard<std::mutex> lock(per_thread_mu);
    for (const std::thread::id& recorder : per_thread_recorders) {
      EXPECT_EQ(recorder, std::this_thread::get_id()) << "step " << step;
    }
  }
  const std::vector<std::string> locks = Marks("LOCK set 0");
  if (rank_ == 0 && LockingOn()) {
    EXPECT_FALSE(locks.empty()) << "the steps never locked";
  }
}

// Each step's first tensor is waited on before the others are enqueued, as a synchronized batch
// norm's statistics are: the plan ends a bucket at the wait, and the lock holds. Fused with the
// tensors after it, the first would wait for a bucket its blocked caller cannot fill, until the
// lock wait ran out and the set left the lock, step after step.
TEST_F(LockedScheduleTest, ACallerThatWaitsMidStepStaysLocked) {
  if (!LockingOn()) GTEST_SKIP() << "locking is off";
  for (int step = 0; step < 12; ++step) {
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<Handle> handles;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      tensors.push_back(Filled(kSizes[t], step + static_cast<int64_t>(t), rank_));
      handles.push_back(allreduce(View(*tensors.back()), Named(Name(t))));
      if (t == 0) {
        ASSERT_TRUE(Succeeds(handles[0])) << "step " << step;
      }
    }
    for (size_t t = 0; t < kSizes.size(); ++t) {
      ASSERT_TRUE(Succeeds(handles[t])) << "step " << step << " " << Name(t);
      ExpectSums(*tensors[t], step + static_cast<int64_t>(t), 0, size_);
    }
  }
  const std::vector<std::string> locks = Marks("LOCK set 0");
  const std::vector<std::string> unlocks = Marks("UNLOCK");
  if (rank_ != 0) return;
  EXPECT_EQ(locks.size(), 1u);
  EXPECT_TRUE(unlocks.empty()) << Joined(unlocks);
  EXPECT_GE(LockedWaits(), 3 * kSizes.size());
}

TEST_F(LockedScheduleTest, ANewNameOnEveryRankUnlocksAndTheLoopLocksAgain) {
  if (!LockingOn()) GTEST_SKIP() << "locking is off";
  for (int step = 0; step < 6; ++step) RunStep(step);
  // A metric reduced once, in the middle of a step.
  auto metric = Filled(4, 100, rank_);
  Handle m = allreduce(View(*metric), Named("lock.metric"));
  ASSERT_TRUE(Succeeds(m));
  ExpectSums(*metric, 100, 0, size_);
  for (int step = 6; step < 14; ++step) RunStep(step);
  const std::vector<std::string> locks = Marks("LOCK set 0");
  const std::vector<std::string> unlocks = Marks("UNLOCK set 0");
  if (rank_ != 0) return;
  EXPECT_EQ(locks.size(), 2u);
  ASSERT_EQ(unlocks.size(), 1u);
  // Rank 0's own reason, or that another rank (which saw the metric first) left or nudged it.
  EXPECT_TRUE(unlocks[0].find("'lock.metric'") != std::string::npos ||
              unlocks[0].find("another rank") != std::string::npos)
      << unlocks[0];
}

TEST_F(LockedScheduleTest, AnotherShapeOnOneRankFailsThatTensorOnEveryRank) {
  if (!LockingOn() || size_ < 2) GTEST_SKIP() << "needs locking and two ranks";
  for (int step = 0; step < 6; ++step) RunStep(step);
  // The last rank passes lock.g2 with one element more; everything else is as planned.
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<Handle> handles;
  for (size_t t = 0; t < kSizes.size(); ++t) {
    const int64_t n = kSizes[t] + (t == 2 && rank_ == size_ - 1 ? 1 : 0);
    tensors.push_back(Filled(n, 6 + static_cast<int64_t>(t), rank_));
    handles.push_back(allreduce(View(*tensors.back()), Named(Name(t))));
  }
  for (size_t t = 0; t < kSizes.size(); ++t) {
    if (t == 2) {
      EXPECT_TRUE(FailsWith(handles[t], StatusCode::kMismatch, "lock.g2"));
    } else {
      ASSERT_TRUE(Succeeds(handles[t]));
      ExpectSums(*tensors[t], 6 + static_cast<int64_t>(t), 0, size_);
    }
  }
  for (int step = 7; step < 14; ++step) RunStep(step);
  const std::vector<std::string> unlocks = Marks("UNLOCK set 0");
  // Rank 0 records the lock left; the reason it gives is its own (another rank left).
  if (rank_ == 0) {
    EXPECT_FALSE(unlocks.empty());
  }
}

TEST_F(LockedScheduleTest, ATensorLateOnOneRankUnlocksAfterTheWaitAndStaysRight) {
  if (!LockingOn() || size_ < 2) GTEST_SKIP() << "needs locking and two ranks";
  for (int step = 0; step < 6; ++step) RunStep(step);
  // The last rank produces lock.g0 long after the rest: three lock waits.
  std::vector<std::unique_ptr<HostTensor>> tensors(kSizes.size());
  std::vector<Handle> handles(kSizes.size());
  auto enqueue = [&](size_t t) {
    tensors[t] = Filled(kSizes[t], 6 + static_cast<int64_t>(t), rank_);
    handles[t] = allreduce(View(*tensors[t]), Named(Name(t)));
  };
  for (size_t t = 1; t < kSizes.size(); ++t) enqueue(t);
  if (rank_ == size_ - 1) std::this_thread::sleep_for(3 * LockWait());
  enqueue(0);
  for (size_t t = 0; t < kSizes.size(); ++t) {
    ASSERT_TRUE(Succeeds(handles[t]));
    ExpectSums(*tensors[t], 6 + static_cast<int64_t>(t), 0, size_);
  }
  for (int step = 7; step < 14; ++step) RunStep(step);
  const std::vector<std::string> unlocks = Marks("UNLOCK set 0");
  if (rank_ == 0) {
    EXPECT_EQ(unlocks.size(), 1u) << Joined(unlocks);
  }
}

TEST_F(LockedScheduleTest, JoinAfterLockingLeavesTheLockAndTheOthersGoOn) {
  if (!LockingOn()) GTEST_SKIP() << "locking is off";
  for (int step = 0; step < 6; ++step) RunStep(step);
  // Rank 0 runs out of data first; the others do two more steps without it.
  int last = -1;
  if (rank_ == 0) {
    last = join();
  } else {
    for (int step = 6; step < 8; ++step) RunStep(step, 1);  // rank 0 takes part with zeros
    last = join();
  }
  EXPECT_GE(last, size_ == 1 ? 0 : 1) << "rank 0 joined first";
  EXPECT_LT(last, size_);
  for (int step = 8; step < 14; ++step) RunStep(step);  // and locks again
}

TEST_F(LockedScheduleTest, NoSetLocksWhileAProcessSetBesideTheGlobalOneExists) {
  if (!LockingOn() || size_ < 3) GTEST_SKIP() << "needs locking and a set smaller than the world";
  for (int step = 0; step < 6; ++step) RunStep(step);  // locked by now
  // Adding a set is a collective the locked plan lacks: the global set leaves the lock.
  ProcessSet pair = add_process_set({0, 1});
  for (int step = 6; step < 14; ++step) {
    RunStep(step);
    if (pair.rank() < 0) continue;
    auto t = Filled(kSizes[1], step, rank_);
    Handle h = allreduce(View(*t), Named("pair.grad", pair));
    ASSERT_TRUE(Succeeds(h));
    ExpectSums(*t, step, 0, 2);
  }
  remove_process_set(pair);
  for (int step = 14; step < 22; ++step) RunStep(step);  // and locks again
  const std::vector<std::string> locks = Marks("LOCK set");
  const std::vector<std::string> unlocks = Marks("UNLOCK set");
  if (rank_ == 0) {
    ASSERT_EQ(locks.size(), 2u);
    EXPECT_EQ(locks[0].rfind("LOCK set 0", 0), 0u) << locks[0];
    EXPECT_EQ(locks[1].rfind("LOCK set 0", 0), 0u) << locks[1];
    ASSERT_EQ(unlocks.size(), 1u) << Joined(unlocks);
    // The reason as rank 0 saw it: its own add_process_set, or, when another rank's release
    // reached it first, that rank's.
    const bool own = unlocks[0].find("add_process_set") != std::string::npos;
    const bool other = unlocks[0].find("another rank") != std::string::npos;
    EXPECT_TRUE(own || other) << unlocks[0];
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
