// The locked schedule played by N threads over the in-process lock hub: the order it runs buckets
// in, and every way of leaving it (a new name, other parameters, a missing tensor, a rank that
// never comes, join, a blocking unlock), each of which must leave every rank at the same bucket
// with the same buckets run.
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

struct Submission {
  std::string name;
  int64_t elements = kElements;
  OpType op = OpType::kAllreduce;
  int root = 0;
};

struct RankResult {
  std::vector<std::vector<std::string>> ran;  // each bucket run, by entry name
  bool unlocked = false;
  std::string reason;
  std::vector<std::string> returned;
  Status failure;
};

struct LockedRun {
  int size = 2;
  std::vector<std::string> plan = Names(8);
  FusionSettings fusion{256, 1 << 20};  // four 64-byte tensors a bucket
  LockSettings settings = FastSettings();
  // What rank r submits in its locked cycle c, having run `ran` buckets.
  std::function<std::vector<Submission>(int rank, int cycle, size_t ran)> submit;
  // A rank stops once it has run this many buckets, or left the lock.
  size_t buckets_to_run = 2;
  // Rank r calls the blocking Unlock in its cycle c.
  std::function<bool(int rank, int cycle)> unlock_at;
  // This rank locks and then runs no cycle at all, as a background thread that stopped.
  int absent = -1;
};

// Every rank observes the plan run for after_steps steps, locks, then runs locked cycles as
// scripted, one thread per rank.
std::vector<RankResult> RunLocked(const LockedRun& run) {
  InProcessLockHub hub(run.size);
  std::vector<RankResult> results(run.size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < run.size; ++rank) {
    threads.emplace_back([&, rank] {
      RankResult& result = results[rank];
      LockedSchedule schedule(hub.Channel(rank), run.settings, 0);
      Observed step(run.plan);
      for (int64_t s = 0; s < run.settings.after_steps; ++s) schedule.Observe(step.Outcome());
      if (!schedule.ready()) {
        result.failure = Status::Internal("not ready after the steps");
        return;
      }
      result.failure = schedule.Lock(run.fusion, step.Cache());
      if (!result.failure.ok() || rank == run.absent) return;
      std::vector<std::unique_ptr<TensorEntry>> entries;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      for (int cycle = 0; std::chrono::steady_clock::now() < deadline; ++cycle) {
        std::vector<TensorEntry*> fresh;
        if (run.submit) {
          for (const Submission& s : run.submit(rank, cycle, result.ran.size())) {
            entries.push_back(EntryFor(s.name, s.elements, s.op, s.root));
            fresh.push_back(entries.back().get());
          }
        }
        LockedCycle out;
        const bool release = run.unlock_at && run.unlock_at(rank, cycle);
        result.failure = schedule.RunCycle(fresh, release, release ? "the test unlocks" : "", &out);
        if (!result.failure.ok()) return;
        for (const CycleOutcome& bucket : out.buckets) {
          std::vector<std::string> names;
          for (size_t i = 0; i < bucket.responses.size(); ++i) {
            EXPECT_EQ(bucket.entries[i]->name, bucket.responses[i]->name);
            names.push_back(bucket.entries[i]->name);
          }
          result.ran.push_back(names);
        }
        if (out.unlocked) {
          EXPECT_FALSE(schedule.locked());
          result.unlocked = true;
          result.reason = out.reason;
          for (const TensorEntry* entry : out.returned) result.returned.push_back(entry->name);
          return;
        }
        if (result.ran.size() >= run.buckets_to_run) return;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      result.failure = Status::Internal("the run did not end");
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

std::vector<Submission> Step(const std::vector<std::string>& names) {
  std::vector<Submission> out;
  for (const std::string& name : names) out.push_back({name});
  return out;
}

void ExpectSameBucketsEverywhere(const std::vector<RankResult>& results) {
  for (const RankResult& r : results) {
    ASSERT_TRUE(r.failure.ok()) << r.failure.ToString();
    EXPECT_EQ(r.ran, results[0].ran);
    EXPECT_EQ(r.unlocked, results[0].unlocked);
  }
}

class LockedScheduleRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(LockedScheduleRanksTest, RunsBucketsInPlanOrderWhateverOrderTensorsArrive) {
  LockedRun run;
  run.size = GetParam();
  run.buckets_to_run = 6;  // three steps of two buckets
  // A step at a time, each rank in its own order, once the step before has run on this rank.
  int steps_given[8] = {0};
  run.submit = [&](int rank, int, size_t ran) {
    std::vector<Submission> out;
    if (ran != 2u * steps_given[rank] || steps_given[rank] == 3) return out;
    ++steps_given[rank];
    std::vector<std::string> step = run.plan;
    if (rank % 2 == 1) std::reverse(step.begin(), step.end());
    if (rank == 2) std::rotate(step.begin(), step.begin() + 3, step.end());
    return Step(step);
  };
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  ASSERT_EQ(results[0].ran.size(), 6u);
  for (size_t b = 0; b < 6; ++b) {
    const size_t first = (b % 2) * 4;
    EXPECT_EQ(results[0].ran[b],
              std::vector<std::string>(run.plan.begin() + first, run.plan.begin() + first + 4));
  }
  EXPECT_FALSE(results[0].unlocked);
}

TEST_P(LockedScheduleRanksTest, ANewNameOnOneRankUnlocksEveryRankAtTheSameBucket) {
  LockedRun run;
  run.size = GetParam();
  run.buckets_to_run = 100;
  const int deviant = run.size - 1;
  run.submit = [&](int rank, int cycle, size_t) {
    std::vector<Submission> out;
    if (cycle == 0) out = Step({run.plan.begin(), run.plan.begin() + 4});  // bucket 0
    if (cycle == 20 && rank == deviant) out.push_back({"metric"});
    if (cycle == 40) {
      out = Step({run.plan.begin() + 4, run.plan.end()});  // bucket 1
    }
    return out;
  };
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  ASSERT_EQ(results[0].ran.size(), 1u);  // bucket 0 ran; the lock ended at bucket 1
  for (int r = 0; r < run.size; ++r) {
    EXPECT_TRUE(results[r].unlocked);
    std::vector<std::string> expected(run.plan.begin() + 4, run.plan.end());
    if (r == deviant) {
      EXPECT_NE(results[r].reason.find("'metric', which is not in the locked plan"),
                std::string::npos)
          << results[r].reason;
      expected.push_back("metric");
    } else {
      // Told by the exchange, or earlier by the deviant's nudge.
      EXPECT_EQ(results[r].reason.rfind("another rank", 0), 0u) << results[r].reason;
    }
    // Bucket 1's tensors arrive after the release on some ranks; those it holds go back.
    for (const std::string& name : results[r].returned) {
      EXPECT_NE(std::find(expected.begin(), expected.end(), name), expected.end()) << name;
    }
  }
  EXPECT_NE(std::find(results[deviant].returned.begin(), results[deviant].returned.end(), "metric"),
            results[deviant].returned.end());
}

TEST_P(LockedScheduleRanksTest, OtherParametersOnOneRankUnlockBeforeTheBucketRuns) {
  LockedRun run;
  run.size = GetParam();
  run.buckets_to_run = 100;
  run.submit = [&](int rank, int cycle, size_t) {
    std::vector<Submission> out;
    if (cycle != 0) return out;
    out = Step({run.plan.begin(), run.plan.begin() + 4});
    if (rank == 0) out[2].elements = kElements + 1;
    return out;
  };
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  EXPECT_TRUE(results[0].ran.empty());
  EXPECT_NE(results[0].reason.find("with its shape [" + std::to_string(kElements + 1) +
                                   "] where the plan has [" + std::to_string(kElements) + "]"),
            std::string::npos)
      << results[0].reason;
  for (const RankResult& r : results) {
    EXPECT_TRUE(r.unlocked);
    EXPECT_EQ(r.returned.size(), 4u);  // every tensor of the bucket, the odd one included
  }
}

// A bucket holds only tensors that follow one another in the step, so the first runs before the
// step's later tensors exist (fused by class, grad.0 would wait for grad.1, behind the broadcast).
TEST_P(LockedScheduleRanksTest, ABucketRunsBeforeTheTensorsThatFollowItInTheStep) {
  LockedRun run;
  run.size = GetParam();
  run.plan = {"grad.0", "bcast.x", "grad.1"};
  run.buckets_to_run = 1;
  run.submit = [&](int, int cycle, size_t) {
    return cycle == 0 ? Step({"grad.0"}) : std::vector<Submission>();
  };
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  EXPECT_FALSE(results[0].unlocked) << results[0].reason;
  EXPECT_EQ(results[0].ran, (std::vector<std::vector<std::string>>{{"grad.0"}}));
}

TEST_P(LockedScheduleRanksTest, ABroadcastFromAnotherRootOnOneRankUnlocksBeforeItRuns) {
  LockedRun run;
  run.size = GetParam();
  run.plan = {"bcast.buffers", "grad.0", "grad.1", "grad.2", "grad.3"};
  run.buckets_to_run = 100;
  run.submit = [&](int rank, int cycle, size_t) {
    std::vector<Submission> out;
    if (cycle != 0) return out;
    out = Step(run.plan);
    if (rank == run.size - 1) out[0].root = 1;
    return out;
  };
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  EXPECT_TRUE(results[0].ran.empty());  // the broadcast is the plan's first bucket
  for (const RankResult& r : results) {
    EXPECT_TRUE(r.unlocked);
    EXPECT_EQ(r.returned.size(), run.plan.size());
  }
  EXPECT_NE(results[run.size - 1].reason.find("broadcast of 'bcast.buffers' with its root "),
            std::string::npos)
      << results[run.size - 1].reason;
}

TEST_P(LockedScheduleRanksTest, AMissingTensorOnOneRankUnlocksAfterTheWait) {
  LockedRun run;
  run.size = GetParam();
  run.buckets_to_run = 100;
  run.submit = [&](int rank, int cycle, size_t) {
    std::vector<Submission> out;
    if (cycle != 0) return out;
    for (const std::string& name : run.plan) {
      if (rank == 1 % run.size && name == "grad.2") continue;  // never comes on that rank
      out.push_back({name});
    }
    return out;
  };
  const auto start = std::chrono::steady_clock::now();
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  EXPECT_TRUE(results[0].ran.empty());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  const RankResult& missing = results[1 % run.size];
  // Its own wait names the tensor; the others' nudge after theirs may come first.
  EXPECT_TRUE(missing.reason.find("on this rank for 'grad.2'") != std::string::npos ||
              missing.reason.rfind("another rank has reached", 0) == 0)
      << missing.reason;
  for (int r = 0; r < run.size; ++r) {
    EXPECT_TRUE(results[r].unlocked);
    EXPECT_EQ(results[r].returned.size(), r == 1 % run.size ? 7u : 8u);
  }
}

TEST_P(LockedScheduleRanksTest, ARankThatNeverComesIsNudgedAndReleases) {
  if (GetParam() == 1) GTEST_SKIP() << "needs another rank";
  LockedRun run;
  run.size = GetParam();
  run.buckets_to_run = 100;
  run.submit = [&](int rank, int cycle, size_t) {
    // The last rank submits nothing at all and so holds nothing: only a nudge reaches it.
    if (cycle != 0 || rank == run.size - 1) return std::vector<Submission>();
    return Step(run.plan);
  };
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  EXPECT_TRUE(results[0].ran.empty());
  EXPECT_NE(results[run.size - 1].reason.find("another rank has reached locked bucket"),
            std::string::npos)
      << results[run.size - 1].reason;
  for (int r = 0; r + 1 < run.size; ++r) EXPECT_EQ(results[r].returned.size(), 8u);
  EXPECT_TRUE(results[run.size - 1].returned.empty());
}

TEST_P(LockedScheduleRanksTest, GivingUpOnARankThatStoppedNamesIt) {
  if (GetParam() == 1) GTEST_SKIP() << "needs another rank";
  LockedRun run;
  run.size = GetParam();
  run.absent = run.size - 1;
  run.settings.stall_shutdown_seconds = 0.3;
  run.submit = [&](int, int cycle, size_t) {
    return cycle == 0 ? Step(run.plan) : std::vector<Submission>();
  };
  const std::vector<RankResult> results = RunLocked(run);
  for (int r = 0; r < run.absent; ++r) {
    EXPECT_EQ(results[r].failure.code(), StatusCode::kStalled) << results[r].failure.ToString();
    EXPECT_NE(
        results[r].failure.message().find("(not there: rank " + std::to_string(run.absent) + ")"),
        std::string::npos)
        << results[r].failure.ToString();
  }
}

TEST_P(LockedScheduleRanksTest, ATensorMissingOnEveryRankUnlocksEveryRank) {
  LockedRun run;
  run.size = GetParam();
  run.buckets_to_run = 100;
  run.submit = [&](int, int cycle, size_t) {
    std::vector<Submission> out;
    if (cycle != 0) return out;
    for (const std::string& name : run.plan) {
      if (name != "grad.5") out.push_back({name});
    }
    return out;
  };
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  ASSERT_EQ(results[0].ran.size(), 1u);  // bucket 0 was whole everywhere
  for (const RankResult& r : results) {
    EXPECT_TRUE(r.unlocked);
    EXPECT_EQ(r.returned.size(), 3u);
  }
}

TEST_P(LockedScheduleRanksTest, JoinUnlocks) {
  LockedRun run;
  run.size = GetParam();
  run.buckets_to_run = 100;
  run.submit = [&](int rank, int cycle, size_t) {
    std::vector<Submission> out;
    if (cycle == 0) out = Step({run.plan.begin(), run.plan.begin() + 4});
    if (cycle == 10 && rank == 0) out.push_back({"join", 0, OpType::kJoin});
    return out;
  };
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  EXPECT_EQ(results[0].ran.size(), 1u);
  EXPECT_EQ(results[0].reason, "this rank called join()");
  EXPECT_EQ(results[0].returned, std::vector<std::string>{"join"});
}

TEST_P(LockedScheduleRanksTest, ABlockingUnlockOnEveryRankLeavesTogether) {
  LockedRun run;
  run.size = GetParam();
  run.buckets_to_run = 100;
  run.submit = [&](int rank, int cycle, size_t) {
    std::vector<Submission> out;
    if (cycle == 0) out = Step({run.plan.begin(), run.plan.begin() + 4});
    if (cycle == 0 && rank == 0) out.push_back({"grad.4"});  // half of bucket 1
    return out;
  };
  // Each rank asks at another moment; the first to ask waits for the rest.
  run.unlock_at = [](int rank, int cycle) { return cycle == 5 + 7 * rank; };
  run.settings.wait_seconds = 5.0;  // grad.4's bucket waits longer than the test takes
  const std::vector<RankResult> results = RunLocked(run);
  ExpectSameBucketsEverywhere(results);
  ASSERT_EQ(results[0].ran.size(), 1u);
  EXPECT_EQ(results[0].returned, std::vector<std::string>{"grad.4"});
  for (const RankResult& r : results) EXPECT_TRUE(r.unlocked);
  // Rank 0, first to ask, left by its release, not by the wait for grad.4's bucket. The others
  // follow its release, or its nudge.
  EXPECT_EQ(results[0].reason, "the test unlocks");
}

INSTANTIATE_TEST_SUITE_P(Ranks, LockedScheduleRanksTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });
}  // namespace
}  // namespace gradsync
