// Generated names and how the locked schedule places them: the names' form, the keys a loop's
// steps repeat (of names and of unnamed groups), the plan's slots by number, and a locked schedule
// running a step with unnamed operations, or one too many of them.
#include "coordinator/unnamed_plan.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "coordinator/locked_schedule.h"
#include "runtime/generated_name.h"
#include "runtime/name_key.h"
#include "test/unit/in_process_channel.h"
#include "test/unit/locked_schedule_harness.h"

namespace gradsync {
namespace {

using namespace locked_test;  // NOLINT: the tests' own vocabulary

TEST(GeneratedNameTest, ParsesWhatItMakes) {
  for (const auto& [op, set, n] : std::vector<std::tuple<std::string, int32_t, uint64_t>>{
           {"allreduce", 0, 0}, {"broadcast", 0, 17}, {"allreduce", 3, 123456789012ull}}) {
    const std::string name = GeneratedName(op, set, n);
    std::string_view stem;
    uint64_t parsed = 0;
    ASSERT_TRUE(ParseGeneratedName(name, &stem, &parsed)) << name;
    EXPECT_EQ(parsed, n);
    EXPECT_EQ(std::string(stem) + std::to_string(n), name);
  }
  EXPECT_EQ(GeneratedName("allreduce", 2, 5), "allreduce.set2.noname.5");
}

TEST(GeneratedNameTest, OtherNamesAreNotGenerated) {
  std::string_view stem;
  uint64_t n = 0;
  for (const char* name :
       {"grad.0", "allreduce.noname.", "allreduce.noname.x1", ".noname.3", "allreduce.noname.3.0",
        "allreduce.noname.99999999999999999999", "", "grad.noname.1", "allreduce.noname.01",
        "allreduce.set0.noname.1", "allreduce.set03.noname.1", "allreduce.sets.noname.1",
        "allreduce.set2.x.noname.1", "xallreduce.noname.1"}) {
    EXPECT_FALSE(ParseGeneratedName(name, &stem, &n)) << name;
  }
}

TEST(StepKeyTest, AGeneratedNameCountsAsItsStem) {
  bool generated = true;
  EXPECT_EQ(StepKey("grad.0", &generated), HashName("grad.0"));
  EXPECT_FALSE(generated);
  const uint64_t first = StepKey("allreduce.noname.5", &generated);
  EXPECT_TRUE(generated);
  EXPECT_EQ(StepKey("allreduce.noname.6", &generated), first);
  EXPECT_NE(StepKey("broadcast.noname.6", &generated), first);
  EXPECT_NE(StepKey("allreduce.set1.noname.6", &generated), first);
}

TEST(GroupKeyTest, AnUnnamedGroupCountsAsEachMembersPlaceInIt) {
  // Two steps of one unnamed group of three: numbers 4-6, then 7-9.
  EXPECT_EQ(GroupKey("allreduce.noname.4", "allreduce.noname.4"),
            GroupKey("allreduce.noname.7", "allreduce.noname.7"));
  EXPECT_EQ(GroupKey("allreduce.noname.4", "allreduce.noname.6"),
            GroupKey("allreduce.noname.7", "allreduce.noname.9"));
  EXPECT_NE(GroupKey("allreduce.noname.4", "allreduce.noname.5"),
            GroupKey("allreduce.noname.7", "allreduce.noname.9"));
  // Named groups, and the empty group of an ungrouped tensor, are their names.
  EXPECT_EQ(GroupKey("layer1.weight", "layer1.bias"), HashName("layer1.weight"));
  EXPECT_EQ(GroupKey("", "allreduce.noname.4"), HashName(""));
  EXPECT_NE(GroupKey("allreduce.noname.4", "allreduce.noname.5"),
            GroupKey("broadcast.noname.4", "broadcast.noname.5"));
}

TEST(UnnamedPlanTest, PlacesNamesByTheirNumber) {
  UnnamedPlan plan;
  const std::vector<std::string> step = {"a", "allreduce.noname.11", "b", "allreduce.noname.10",
                                         "broadcast.noname.4"};
  ASSERT_TRUE(plan.Build(step, step.size()));
  int64_t slot = 0;
  EXPECT_FALSE(plan.Find("a", &slot));
  ASSERT_TRUE(plan.Find("allreduce.noname.12", &slot));
  EXPECT_EQ(slot, 3);  // the place of 10, a step on
  ASSERT_TRUE(plan.Find("allreduce.noname.13", &slot));
  EXPECT_EQ(slot, 1);
  ASSERT_TRUE(plan.Find("broadcast.noname.5", &slot));
  EXPECT_EQ(slot, 4);
  ASSERT_TRUE(plan.Find("allreduce.noname.9", &slot));
  EXPECT_EQ(slot, -1);  // before the plan's step
  ASSERT_TRUE(plan.Find("allreduce.set1.noname.12", &slot));
  EXPECT_EQ(slot, -1);  // a stem the plan does not hold
  EXPECT_EQ(plan.KeyOf("allreduce.noname.12"), plan.KeyOf("allreduce.noname.10"));
  EXPECT_NE(plan.KeyOf("allreduce.noname.12"), plan.KeyOf("allreduce.noname.13"));
}

TEST(UnnamedPlanTest, NumbersWithGapsOrRepeatsAreNoPlan) {
  UnnamedPlan plan;
  const std::vector<std::string> gap = {"allreduce.noname.10", "allreduce.noname.12"};
  EXPECT_FALSE(plan.Build(gap, gap.size()));
  EXPECT_TRUE(plan.empty());
  const std::vector<std::string> repeat = {"allreduce.noname.10", "allreduce.noname.10"};
  EXPECT_FALSE(plan.Build(repeat, repeat.size()));
  const std::vector<std::string> none = {"a", "b"};
  EXPECT_TRUE(plan.Build(none, none.size()));
  EXPECT_TRUE(plan.empty());
}

// Steps of two gradients and an unnamed allreduce, each step's with the next number.
std::vector<std::string> StepWithUnnamed(int step) {
  return {"grad.0", "grad.1", "allreduce.noname." + std::to_string(step)};
}

// A schedule locked on three such steps, and the entries of later ones.
class LockedUnnamedScheduleTest : public ::testing::Test {
 protected:
  LockedUnnamedScheduleTest() : schedule_(hub_.Channel(0), FastSettings(3), 0) {
    for (int s = 0; s < 3; ++s) {
      steps_.push_back(std::make_unique<Observed>(StepWithUnnamed(s)));
      schedule_.Observe(steps_.back()->Outcome());
    }
  }
  std::vector<TensorEntry*> Entries(const std::vector<std::string>& names) {
    std::vector<TensorEntry*> fresh;
    for (const std::string& name : names) {
      entries_.push_back(EntryFor(name));
      fresh.push_back(entries_.back().get());
    }
    return fresh;
  }

  InProcessLockHub hub_{1};
  LockedSchedule schedule_;
  std::vector<std::unique_ptr<Observed>> steps_;
  std::vector<std::unique_ptr<TensorEntry>> entries_;
};

TEST_F(LockedUnnamedScheduleTest, LocksAndRunsTheNextStepsUnnamedOperation) {
  ASSERT_TRUE(schedule_.ready());
  ASSERT_TRUE(schedule_.Lock({}, steps_.back()->Cache()).ok());
  ASSERT_TRUE(schedule_.locked());
  for (int s = 3; s < 6; ++s) {
    LockedCycle out;
    ASSERT_TRUE(schedule_.RunCycle(Entries(StepWithUnnamed(s)), false, "", &out).ok());
    ASSERT_FALSE(out.unlocked) << out.reason;
    std::vector<std::string> ran;
    for (const CycleOutcome& bucket : out.buckets) {
      for (const TensorEntry* entry : bucket.entries) ran.push_back(entry->name);
    }
    EXPECT_EQ(ran, StepWithUnnamed(s));
  }
}

// The step under way holds two unnamed allreduces where the plan's has one: both would take the
// one place, whose bucket would then never fill. The schedule stays negotiated instead.
TEST_F(LockedUnnamedScheduleTest, AStepUnderWayWithTwoOperationsInOnePlaceDoesNotLock) {
  Observed two({"allreduce.noname.3", "allreduce.noname.4"});
  schedule_.Observe(two.Outcome());
  ASSERT_TRUE(schedule_.ready());
  ASSERT_TRUE(schedule_.Lock({}, steps_.back()->Cache()).ok());
  EXPECT_FALSE(schedule_.locked());
  EXPECT_FALSE(schedule_.ready());
}

TEST_F(LockedUnnamedScheduleTest, AnUnnamedOperationAheadOfItsStepLeaves) {
  ASSERT_TRUE(schedule_.Lock({}, steps_.back()->Cache()).ok());
  LockedCycle out;
  ASSERT_TRUE(schedule_.RunCycle(Entries(StepWithUnnamed(3)), false, "", &out).ok());
  ASSERT_FALSE(out.unlocked);
  // One more unnamed allreduce: the fifth step's place, ahead of that step's gradients.
  const std::vector<TensorEntry*> extra = Entries({"allreduce.noname.4"});
  LockedCycle left;
  ASSERT_TRUE(schedule_.RunCycle(extra, false, "", &left).ok());
  ASSERT_TRUE(left.unlocked);
  EXPECT_NE(left.reason.find("placed by their order"), std::string::npos) << left.reason;
  EXPECT_EQ(left.returned, extra);
}

}  // namespace
}  // namespace gradsync
