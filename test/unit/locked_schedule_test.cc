// The locked schedule on one rank over the in-process lock hub: when it becomes ready, how it
// plans its buckets, and where locking mid-step leaves the step. Several ranks playing it out are
// in locked_schedule_ranks_test.cc.
#include "coordinator/locked_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "test/unit/in_process_channel.h"
#include "test/unit/locked_schedule_harness.h"

namespace gradsync {
namespace {

using namespace locked_test;  // NOLINT: the tests' own vocabulary

TEST(LockedScheduleTest, ReadyAfterTheConfiguredIdenticalSteps) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(3), 0);
  Observed step(Names(4));
  schedule.Observe(step.Outcome());
  schedule.Observe(step.Outcome());
  EXPECT_FALSE(schedule.ready());
  schedule.Observe(step.Outcome());
  EXPECT_TRUE(schedule.ready());
}

// Unnamed operations are each named after their call, so no name comes back to end a step: the
// step is cut at the longest a lock could take, and what it keeps stays bounded.
TEST(LockedScheduleTest, NamesThatNeverComeBackKeepTheStepBounded) {
  InProcessLockHub hub(1);
  LockSettings settings = FastSettings(2);
  settings.longest_step = 8;
  LockedSchedule schedule(hub.Channel(0), settings, 0);
  for (int i = 0; i < 1000; ++i) {
    Observed call({"gradsync.allreduce." + std::to_string(i)});
    schedule.Observe(call.Outcome());
  }
  EXPECT_LE(schedule.observed_names_kept(), 2 * (settings.longest_step + 1));
  EXPECT_FALSE(schedule.ready());
  // A loop of that many tensors settles into whole steps again and locks.
  Observed step(Names(8));
  for (int i = 0; i < 4; ++i) schedule.Observe(step.Outcome());
  EXPECT_TRUE(schedule.ready());
}

TEST(LockedScheduleTest, AStepLongerThanTheLongestNeverLocks) {
  InProcessLockHub hub(1);
  LockSettings settings = FastSettings(2);
  settings.longest_step = 8;
  LockedSchedule fits(hub.Channel(0), settings, 0);
  Observed eight(Names(8));
  for (int i = 0; i < 2; ++i) fits.Observe(eight.Outcome());
  EXPECT_TRUE(fits.ready());
  InProcessLockHub other_hub(1);
  LockedSchedule too_long(other_hub.Channel(0), settings, 0);
  Observed nine(Names(9));
  for (int i = 0; i < 6; ++i) too_long.Observe(nine.Outcome());
  EXPECT_FALSE(too_long.ready());
}

TEST(LockedScheduleTest, LockingMidStepRunsOnlyWhatTheStepHasLeft) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  Observed step(Names(8));
  schedule.Observe(step.Outcome());
  schedule.Observe(step.Outcome());
  Observed half({"grad.0", "grad.1", "grad.4", "grad.5", "grad.6", "grad.7"});
  schedule.Observe(half.Outcome());  // the third step has begun: bucket 1 is done already
  ASSERT_TRUE(schedule.ready());
  ASSERT_TRUE(schedule.Lock({256, 1 << 20}, step.Cache()).ok());
  ASSERT_TRUE(schedule.locked());
  // The next step's grad.4 may come before this step's grad.2 and grad.3: it waits for its turn.
  auto early = EntryFor("grad.4");
  auto g2 = EntryFor("grad.2");
  auto g3 = EntryFor("grad.3");
  LockedCycle out;
  ASSERT_TRUE(schedule.RunCycle({early.get(), g2.get()}, false, "", &out).ok());
  EXPECT_TRUE(out.buckets.empty());
  ASSERT_TRUE(schedule.RunCycle({g3.get()}, false, "", &out).ok());
  ASSERT_EQ(out.buckets.size(), 1u);
  EXPECT_EQ(out.buckets[0].entries, (std::vector<TensorEntry*>{g2.get(), g3.get()}));
  ASSERT_EQ(out.buckets[0].responses.size(), 2u);
  EXPECT_EQ(out.buckets[0].responses[1]->name, "grad.3");
  // The next step: bucket 0 whole, then bucket 1 with the early grad.4.
  std::vector<std::unique_ptr<TensorEntry>> next;
  std::vector<TensorEntry*> fresh;
  for (const std::string& name : Names(8)) {
    if (name == "grad.4") continue;
    next.push_back(EntryFor(name));
    fresh.push_back(next.back().get());
  }
  LockedCycle second;
  ASSERT_TRUE(schedule.RunCycle(fresh, false, "", &second).ok());
  ASSERT_EQ(second.buckets.size(), 2u);
  EXPECT_EQ(second.buckets[0].entries.size(), 4u);
  EXPECT_EQ(second.buckets[1].entries[0], early.get());
  EXPECT_FALSE(second.unlocked);
}

// The channel breaks after the cycle's first bucket was agreed on every rank (its look for nudges
// fails): that bucket is returned to run (the others run it, and would wait in its collective),
// and the next cycle returns the failure.
TEST(LockedScheduleTest, AChannelFailureAfterAnAgreedBucketComesAfterIt) {
  InProcessLockHub hub(1);
  hub.BreakAfter(0, 1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  Observed step(Names(8));
  schedule.Observe(step.Outcome());
  schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.Lock({256, 1 << 20}, step.Cache()).ok());  // two buckets of four
  std::vector<std::unique_ptr<TensorEntry>> entries;
  std::vector<TensorEntry*> fresh;
  for (const std::string& name : Names(6)) {
    entries.push_back(EntryFor(name));
    fresh.push_back(entries.back().get());
  }
  LockedCycle out;
  ASSERT_TRUE(schedule.RunCycle(fresh, false, "", &out).ok());
  ASSERT_EQ(out.buckets.size(), 1u);
  EXPECT_EQ(out.buckets[0].entries.size(), 4u);
  EXPECT_TRUE(schedule.exchanging());  // the loop comes back for the failure
  LockedCycle next;
  const Status failed = schedule.RunCycle({}, false, "", &next);
  EXPECT_NE(failed.message().find("the test broke the channel"), std::string::npos)
      << failed.ToString();
  EXPECT_TRUE(next.buckets.empty());
  EXPECT_EQ(schedule.TakeAllHeld().size(), 2u);  // the second bucket's, for the caller to fail
}

TEST(LockedScheduleTest, AStepThatDiffersStartsTheCountAgain) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  Observed step(Names(4));
  Observed other({"grad.0", "grad.1", "grad.2", "grad.9"});
  schedule.Observe(step.Outcome());
  schedule.Observe(other.Outcome());  // "grad.0" comes back: the first step ends; this one differs
  schedule.Observe(step.Outcome());
  EXPECT_FALSE(schedule.ready());
  schedule.Observe(step.Outcome());
  EXPECT_TRUE(schedule.ready());
}

TEST(LockedScheduleTest, StepsWithOtherCollectivesOrJoinedRanksNeverLock) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  Observed step(Names(3));
  CycleOutcome joined = step.Outcome();
  joined.joined = true;
  for (int i = 0; i < 4; ++i) schedule.Observe(joined);
  EXPECT_FALSE(schedule.ready());

  // An allgather's sizes may change on one rank alone: a step with one never locks.
  auto allgather = std::make_shared<Response>(AllreduceResponse("gathered"));
  allgather->type = ResponseType::kAllgather;
  auto entry = EntryFor("gathered", kElements, OpType::kAllgather);
  for (int i = 0; i < 4; ++i) {
    schedule.Observe(step.Outcome());
    CycleOutcome with_allgather;
    with_allgather.responses.push_back(allgather.get());
    with_allgather.entries.push_back(entry.get());
    schedule.Observe(with_allgather);
  }
  EXPECT_FALSE(schedule.ready());
}

// A DDP wrapper's step: its buffers broadcast in forward, then its gradients reduced.
TEST(LockedScheduleTest, StepsWithBroadcastsLockAndRunTheBroadcastInItsPlace) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  const std::vector<std::string> plan = {"bcast.buffers", "grad.0", "grad.1"};
  Observed step(plan);
  for (int i = 0; i < 3; ++i) schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.ready());
  ASSERT_TRUE(schedule.Lock({}, step.Cache()).ok());
  ASSERT_TRUE(schedule.locked());
  std::vector<std::unique_ptr<TensorEntry>> entries;
  std::vector<TensorEntry*> fresh;
  for (const std::string& name : plan) {
    entries.push_back(EntryFor(name));
    fresh.push_back(entries.back().get());
  }
  std::vector<std::string> ran;
  for (int cycle = 0; cycle < 100 && ran.size() < plan.size(); ++cycle) {
    LockedCycle out;
    ASSERT_TRUE(
        schedule.RunCycle(cycle == 0 ? fresh : std::vector<TensorEntry*>(), false, "", &out).ok());
    ASSERT_FALSE(out.unlocked) << out.reason;
    for (const CycleOutcome& bucket : out.buckets) {
      for (size_t i = 0; i < bucket.responses.size(); ++i) {
        EXPECT_EQ(bucket.responses[i]->type, IsBroadcast(bucket.entries[i]->name)
                                                 ? ResponseType::kBroadcast
                                                 : ResponseType::kAllreduce);
        ran.push_back(bucket.entries[i]->name);
      }
    }
  }
  EXPECT_EQ(ran, plan);
}

// The background thread sleeps until the queue holds what the next bucket still needs.
TEST(LockedScheduleTest, CountsWhatTheNextBucketStillNeeds) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  Observed step(Names(8));
  EXPECT_EQ(schedule.MissingForNextBucket(), 0u);  // not locked
  for (int i = 0; i < 3; ++i) schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.Lock({256, 1 << 20}, step.Cache()).ok());  // four tensors a bucket
  ASSERT_TRUE(schedule.locked());
  EXPECT_EQ(schedule.MissingForNextBucket(), 4u);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  std::vector<TensorEntry*> fresh;
  for (const char* name : {"grad.0", "grad.1", "grad.2", "grad.5"}) {
    entries.push_back(EntryFor(name));
    fresh.push_back(entries.back().get());
  }
  LockedCycle out;
  ASSERT_TRUE(schedule.RunCycle(fresh, false, "", &out).ok());
  EXPECT_TRUE(out.buckets.empty());
  EXPECT_EQ(schedule.MissingForNextBucket(), 1u);  // grad.5 is the second bucket's
  entries.push_back(EntryFor("unplanned"));
  ASSERT_TRUE(schedule.RunCycle({entries.back().get()}, false, "", &out).ok());
  EXPECT_EQ(schedule.MissingForNextBucket(), 0u);  // leaving: nothing to wait for
}

// GRADSYNC_CALLER_LAUNCH=single gives the caller a bucket of one tensor and the background thread
// a fused one: the schedule tells the size of the bucket it waits for next, turn after turn.
TEST(LockedScheduleTest, TellsTheNextBucketsSize) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  Observed step(Names(5), {0, 0, 0, 1, 2});  // the caller's waits cut it into 3, 1 and 1
  EXPECT_EQ(schedule.NextBucketSize(), 0u);  // not locked
  for (int i = 0; i < 3; ++i) schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.Lock({256, 1 << 20}, step.Cache()).ok());
  ASSERT_TRUE(schedule.locked());
  std::vector<size_t> sizes;
  std::vector<std::unique_ptr<TensorEntry>> entries;
  for (int turn = 0; turn < 2; ++turn) {
    for (const std::string& name : Names(5)) {
      sizes.push_back(schedule.NextBucketSize());
      entries.push_back(EntryFor(name));
      LockedCycle out;
      ASSERT_TRUE(schedule.RunCycle({entries.back().get()}, false, "", &out).ok());
      ASSERT_FALSE(out.unlocked) << out.reason;
    }
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 3, 1, 1, 3, 3, 3, 1, 1}));
}

// A caller's cycle under GRADSYNC_CALLER_LAUNCH=single runs buckets of one tensor only: it stops
// before a fused bucket, even a full one, and its exchange does not take the fused bucket along
// with the one before it; the loop's next cycle runs it.
TEST(LockedScheduleTest, ACycleLimitedToOneTensorLeavesFusedBucketsForTheNext) {
  InProcessLockHub hub(1);
  LockSettings settings = FastSettings(2);
  settings.single_apart = true;
  LockedSchedule schedule(hub.Channel(0), settings, 0);
  Observed step(Names(5), {0, 1, 1, 1, 2});  // the caller's waits cut it into 1, 3 and 1
  for (int i = 0; i < 3; ++i) schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.Lock({256, 1 << 20}, step.Cache()).ok());
  ASSERT_TRUE(schedule.locked());
  std::vector<std::unique_ptr<TensorEntry>> entries;
  std::vector<TensorEntry*> fresh;
  for (const std::string& name : Names(5)) {
    entries.push_back(EntryFor(name));
    fresh.push_back(entries.back().get());
  }
  LockedCycle callers;
  ASSERT_TRUE(schedule.RunCycle(fresh, false, "", &callers, false, /*most_tensors=*/1).ok());
  ASSERT_EQ(callers.buckets.size(), 1u);
  EXPECT_EQ(callers.buckets[0].entries.size(), 1u);
  EXPECT_EQ(schedule.NextBucketSize(), 3u);
  EXPECT_EQ(schedule.MissingForNextBucket(), 0u);  // full: the loop's thread should run it
  EXPECT_FALSE(schedule.exchanging());
  LockedCycle loops;
  ASSERT_TRUE(schedule.RunCycle({}, false, "", &loops).ok());
  ASSERT_EQ(loops.buckets.size(), 2u);
  EXPECT_EQ(loops.buckets[0].entries.size(), 3u);
  EXPECT_EQ(loops.buckets[1].entries.size(), 1u);
}

TEST(LockedScheduleTest, DisabledNeverLocks) {
  InProcessLockHub hub(1);
  LockSettings settings = FastSettings(1);
  settings.enabled = false;
  LockedSchedule schedule(hub.Channel(0), settings, 0);
  Observed step(Names(3));
  for (int i = 0; i < 5; ++i) schedule.Observe(step.Outcome());
  EXPECT_FALSE(schedule.ready());
}

TEST(LockedScheduleTest, AResponseNoLongerCachedLeavesItUnlocked) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(1), 0);
  Observed step(Names(3));
  schedule.Observe(step.Outcome());
  EXPECT_FALSE(schedule.ready());  // a first step is seen to end only when the next begins
  schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.ready());
  ASSERT_TRUE(schedule.Lock({}, [](const std::string&) { return nullptr; }).ok());
  EXPECT_FALSE(schedule.locked());
  EXPECT_EQ(hub.opened(), 0);
}

TEST(LockedScheduleTest, BucketsFollowTheFusionSettings) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(1), 0);
  Observed step(Names(10));
  schedule.Observe(step.Outcome());
  schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.Lock({128, 1 << 20}, step.Cache()).ok());  // two tensors a bucket
  EXPECT_TRUE(schedule.locked());
  EXPECT_EQ(schedule.planned_buckets(), 5u);
  EXPECT_EQ(hub.opened(), 1);
}

// A caller that waits for one result before it enqueues the next tensor (a synchronized batch
// norm's statistics in forward, then in backward) would wait for ever on a bucket that only that
// tensor fills: no bucket holds tensors from both sides of a wait, whatever the fusion allows.
TEST(LockedScheduleTest, NoBucketHoldsTensorsFromBothSidesOfAWait) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  const std::vector<std::string> names = {"bn.forward", "bn.backward", "grad.0", "grad.1",
                                          "grad.2"};
  Observed step(names, {40, 41, 42, 42, 42});
  schedule.Observe(step.Outcome());
  schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.Lock({1 << 20, 1 << 20}, step.Cache()).ok());
  ASSERT_TRUE(schedule.locked());
  EXPECT_EQ(schedule.planned_buckets(), 3u);
  auto forward = EntryFor("bn.forward");
  LockedCycle out;
  ASSERT_TRUE(schedule.RunCycle({forward.get()}, false, "", &out).ok());
  ASSERT_EQ(out.buckets.size(), 1u);
  EXPECT_EQ(out.buckets[0].entries, std::vector<TensorEntry*>{forward.get()});
}

// Where the caller waits decides whether this rank offers to lock: a step cut elsewhere starts
// that count again. The steps are the same steps all the same, as they are on the other ranks.
TEST(LockedScheduleTest, AStepWaitedOnElsewhereStartsTheCountAgain) {
  InProcessLockHub hub(1);
  LockedSchedule schedule(hub.Channel(0), FastSettings(2), 0);
  Observed waited(Names(4), {0, 1, 1, 1});
  Observed streamed(Names(4), {5, 5, 5, 5});
  schedule.Observe(waited.Outcome());
  schedule.Observe(streamed.Outcome());  // ends the first step, whose cuts differ from this one's
  EXPECT_TRUE(schedule.ready());
  EXPECT_FALSE(schedule.WantsToLock());
  schedule.Observe(streamed.Outcome());
  EXPECT_TRUE(schedule.WantsToLock());
}

// After a round in which every rank offered to lock, each decides from ready() whether the cycle's
// responses left the steps identical, and locks or not: every rank must decide alike, or some lock
// while the others negotiate, and both wait for ever. Here one rank's caller sometimes waits on a
// result between two enqueues of an observed step and sometimes polls for it, while the other's
// never waits there: their cuts differ, their responses do not.
TEST(LockedScheduleTest, RanksThatWaitDifferentlyJudgeTheStepsAlike) {
  InProcessLockHub hub(2);
  LockedSchedule varying(hub.Channel(0), FastSettings(3), 0);
  LockedSchedule steady(hub.Channel(1), FastSettings(3), 0);
  Observed polled(Names(4), {7, 7, 7, 7});
  for (int step = 0; step < 12; ++step) {
    const uint64_t w = static_cast<uint64_t>(step) * 2;
    Observed mine(Names(4), step % 3 == 0 ? std::vector<uint64_t>{w, w, w, w}
                                          : std::vector<uint64_t>{w, w, w + 1, w + 1});
    varying.Observe(mine.Outcome());
    steady.Observe(polled.Outcome());
    EXPECT_EQ(varying.ready(), steady.ready()) << "after step " << step;
  }
  EXPECT_TRUE(steady.ready());
  EXPECT_TRUE(steady.WantsToLock());
  EXPECT_FALSE(varying.WantsToLock());  // its next step may be cut where its plan is not
}

TEST(LockedScheduleTest, TakeAllHeldReturnsEverythingAndUnlocks) {
  InProcessLockHub hub(2);
  LockedSchedule schedule(hub.Channel(0), FastSettings(1), 0);
  Observed step(Names(8));
  schedule.Observe(step.Outcome());
  schedule.Observe(step.Outcome());
  ASSERT_TRUE(schedule.Lock({256, 1 << 20}, step.Cache()).ok());
  auto a = EntryFor("grad.1");
  auto b = EntryFor("grad.6");
  auto c = EntryFor("stranger");
  LockedCycle out;
  ASSERT_TRUE(schedule.RunCycle({a.get(), b.get(), c.get()}, false, "", &out).ok());
  EXPECT_TRUE(out.buckets.empty());
  const std::vector<TensorEntry*> held = schedule.TakeAllHeld();
  EXPECT_EQ(held, (std::vector<TensorEntry*>{a.get(), b.get(), c.get()}));
  EXPECT_FALSE(schedule.locked());
}

}  // namespace
}  // namespace gradsync
