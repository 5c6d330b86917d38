// Unnamed operations in a locked loop. gradsync names each one after its call
// ("allreduce.noname.<n>"), so a loop that averages an unnamed loss every step never repeated a
// step, and never locked. The lock now places them by their order in the step: such a loop locks
// and stays right (an unnamed group, known by its first member's name, too), an unnamed operation
// more than the steps have leaves the lock at once (not after GRADSYNC_LOCK_WAIT_MS), and one fewer
// leaves it, as a missing tensor does, with every result right. Built into locked_schedule_test's
// binary, under its settings.
#include <memory>
#include <string>
#include <vector>

#include "test/mpi/locked_schedule_fixture.h"

namespace gradsync {
namespace testing {
namespace {

class LockedUnnamedTest : public LockedScheduleTest {
 protected:
  // A one-element unnamed allreduce, waited on and checked, as a loop averages its loss.
  void UnnamedMetric(int step) {
    auto metric = Filled(1, 100 + step, rank_);
    AllreduceOptions unnamed;
    Handle h = allreduce(View(*metric), unnamed);
    ASSERT_TRUE(Succeeds(h)) << "step " << step;
    ExpectSums(*metric, 100 + step, 0, size_);
  }

  void Step(int step, int metrics = 1) {
    RunStep(step);
    for (int m = 0; m < metrics; ++m) UnnamedMetric(step);
  }

  // The step's tensors and an unnamed metric enqueued in one burst, then all waited on: every
  // cycle that takes the burst holds an operation new to negotiation.
  void BurstStep(int step) {
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<Handle> handles;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      tensors.push_back(Filled(kSizes[t], step + static_cast<int64_t>(t), rank_));
      handles.push_back(allreduce(View(*tensors.back()), Named(Name(t))));
    }
    auto metric = Filled(1, 100 + step, rank_);
    handles.push_back(allreduce(View(*metric), AllreduceOptions()));
    for (const Handle& h : handles) ASSERT_TRUE(Succeeds(h)) << "step " << step;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      ExpectSums(*tensors[t], step + static_cast<int64_t>(t), 0, size_);
    }
    ExpectSums(*metric, 100 + step, 0, size_);
  }

  // Rank 0's timeline: one lock, never left, and at least three steps of `per_step` tensors
  // that waited for their locked buckets.
  void ExpectLockedOnce(size_t per_step) {
    const std::vector<std::string> locks = Marks("LOCK set 0");
    const std::vector<std::string> unlocks = Marks("UNLOCK");
    if (rank_ != 0 || !LockingOn()) return;
    ASSERT_EQ(locks.size(), 1u);
    EXPECT_TRUE(unlocks.empty()) << unlocks.front();
    EXPECT_GE(LockedWaits(), 3 * per_step);
  }

  // Two metrics of different sizes in one unnamed grouped allreduce, waited on and checked. The
  // group is known by its first member's generated name, so it too is new at every call.
  void UnnamedGroup(int step) {
    auto loss = Filled(1, 200 + step, rank_);
    auto accuracy = Filled(3, 300 + step, rank_);
    const std::vector<Handle> handles = grouped_allreduce({View(*loss), View(*accuracy)});
    ASSERT_EQ(handles.size(), 2u);
    for (const Handle& h : handles) ASSERT_TRUE(Succeeds(h)) << "step " << step;
    ExpectSums(*loss, 200 + step, 0, size_);
    ExpectSums(*accuracy, 300 + step, 0, size_);
  }
};

TEST_F(LockedUnnamedTest, AnUnnamedAllreduceEachStepLocksAndStaysRight) {
  for (int step = 0; step < 12; ++step) Step(step);
  ExpectLockedOnce(kSizes.size() + 1);
}

TEST_F(LockedUnnamedTest, AnUnnamedGroupEachStepLocksAndStaysRight) {
  for (int step = 0; step < 12; ++step) {
    RunStep(step);
    UnnamedGroup(step);
    UnnamedMetric(step);
  }
  ExpectLockedOnce(kSizes.size() + 3);
}

// Locking waits for a cycle in which nothing has gone to a full round: a metric handed over in
// the same burst as the step's tensors is new in every such cycle, and such a loop locked only
// when a cycle happened to take the burst without it (at 2 ranks, in one of three runs of 300
// steps). Not yet sent, it passes to the lock with the cached tensors.
TEST_F(LockedUnnamedTest, AnUnnamedAllreduceInTheStepsBurstLocks) {
  for (int step = 0; step < 12; ++step) BurstStep(step);
  ExpectLockedOnce(kSizes.size() + 1);
}

TEST_F(LockedUnnamedTest, OneMoreUnnamedOperationLeavesTheLockAtOnce) {
  for (int step = 0; step < 8; ++step) Step(step);  // locked by now
  Step(8, 2);
  for (int step = 9; step < 17; ++step) Step(step);  // and locks again
  const std::vector<std::string> locks = Marks("LOCK set 0");
  const std::vector<std::string> unlocks = Marks("UNLOCK set 0");
  if (rank_ != 0 || !LockingOn()) return;
  ASSERT_EQ(locks.size(), 2u) << Joined(unlocks);
  ASSERT_EQ(unlocks.size(), 1u) << Joined(unlocks);
  // Left when the extra one came, by this rank or another one that saw its own: never by
  // waiting out the lock wait for a step that could not come while the extra one waited.
  const bool own = unlocks[0].find("placed by their order") != std::string::npos;
  const bool other = unlocks[0].find("another rank") != std::string::npos;
  EXPECT_TRUE(own || other) << unlocks[0];
}

TEST_F(LockedUnnamedTest, OneFewerUnnamedOperationLeavesTheLockAndStaysRight) {
  for (int step = 0; step < 8; ++step) Step(step);  // locked by now
  Step(8, 0);
  for (int step = 9; step < 17; ++step) Step(step);  // and locks again
  const std::vector<std::string> locks = Marks("LOCK set 0");
  const std::vector<std::string> unlocks = Marks("UNLOCK set 0");
  if (rank_ != 0 || !LockingOn()) return;
  EXPECT_EQ(locks.size(), 2u) << Joined(unlocks);
  EXPECT_EQ(unlocks.size(), 1u) << Joined(unlocks);
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
