#include "coordinator/autotuner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace gradsync {
namespace {

const TunableSettings kStart{256 << 10, 8 << 20, 1.0};
const TunedParameters kAll;

TunedParameters AllButCycleTime() {
  TunedParameters tuned;
  tuned.cycle_time = false;
  return tuned;
}

// Runs the tuner to the end against a step-time model; returns the lines it logged.
std::vector<std::string> Tune(Autotuner* tuner,
                              const std::function<double(const TunableSettings&)>& step_seconds,
                              std::vector<TunableSettings>* tried = nullptr) {
  std::vector<std::string> lines;
  for (int guard = 0; !tuner->done() && guard < 100; ++guard) {
    if (tried) tried->push_back(tuner->current());
    lines.push_back(tuner->Record(Autotuner::kStepsPerWindow * step_seconds(tuner->current())));
  }
  return lines;
}

TEST(AutotunerTest, SettlesWithinTenWindowsOnTheBestSettingsSeen) {
  Autotuner tuner(kStart, 64 << 20, kAll);
  // Faster with larger buckets and never alone; the cycle time does not matter.
  const auto model = [](const TunableSettings& s) {
    return 1.0 / std::log2(double(s.fusion_threshold_bytes)) +
           (s.inplace_threshold_bytes >= (int64_t{1} << 40) ? 0.0 : 0.01);
  };
  std::vector<TunableSettings> tried;
  const std::vector<std::string> lines = Tune(&tuner, model, &tried);
  EXPECT_LE(lines.size(), 10u);
  ASSERT_TRUE(tuner.done());
  EXPECT_EQ(tuner.current().inplace_threshold_bytes, int64_t{1} << 40);
  EXPECT_EQ(tuner.current().fusion_threshold_bytes, 64 << 20);
  EXPECT_EQ(tried.front(), kStart);  // the calibrated settings are measured first
  for (const TunableSettings& s : tried) {
    EXPECT_LE(s.fusion_threshold_bytes, 64 << 20);
    EXPECT_GE(s.fusion_threshold_bytes, 1 << 20);
    EXPECT_GE(s.inplace_threshold_bytes, 64 << 10);
    EXPECT_GE(s.cycle_time_ms, 0.1);
  }
}

TEST(AutotunerTest, KeepsTheStartWhenNothingBeatsIt) {
  Autotuner tuner(kStart, 64 << 20, kAll);
  Tune(&tuner, [](const TunableSettings& s) { return s == kStart ? 0.1 : 0.2; });
  EXPECT_EQ(tuner.current(), kStart);
}

TEST(AutotunerTest, LeavesTheCycleTimeAloneWhenAskedTo) {
  Autotuner tuner(kStart, 64 << 20, AllButCycleTime());
  std::vector<TunableSettings> tried;
  const auto lines = Tune(
      &tuner, [](const TunableSettings& s) { return s.cycle_time_ms; }, &tried);
  EXPECT_LE(lines.size(), 7u);
  for (const TunableSettings& s : tried) EXPECT_EQ(s.cycle_time_ms, 1.0);
}

TEST(AutotunerTest, NeverTriesTheSameSettingsTwice) {
  Autotuner tuner({64 << 10, 64 << 20, 0.1}, 64 << 20, kAll);  // already at the extremes
  std::vector<TunableSettings> tried;
  Tune(
      &tuner, [](const TunableSettings&) { return 0.1; }, &tried);
  for (size_t i = 0; i < tried.size(); ++i) {
    for (size_t j = i + 1; j < tried.size(); ++j) EXPECT_FALSE(tried[i] == tried[j]) << i << j;
  }
}

TEST(AutotunerTest, FromNeverAloneItTriesMediumAndLargeTensorsAlone) {
  Autotuner tuner({int64_t{1} << 40, 8 << 20, 1.0}, 64 << 20, AllButCycleTime());
  std::vector<TunableSettings> tried;
  Tune(
      &tuner,
      [](const TunableSettings& s) { return s.inplace_threshold_bytes == 4 << 20 ? 0.1 : 0.2; },
      &tried);
  ASSERT_GE(tried.size(), 3u);
  EXPECT_EQ(tried[1].inplace_threshold_bytes, 256 << 10);
  EXPECT_EQ(tried[2].inplace_threshold_bytes, 4 << 20);
  EXPECT_EQ(tuner.current().inplace_threshold_bytes, 4 << 20);
}

TEST(AutotunerTest, LogLinesNameTheWindowAndTheSettings) {
  Autotuner tuner(kStart, 64 << 20, kAll);
  EXPECT_EQ(Autotuner::Header(),
            "window,parameter,inplace_threshold_bytes,fusion_threshold_bytes,cycle_time_ms,step_ms,"
            "best");
  EXPECT_EQ(tuner.Record(0.3), "0,start,262144,8388608,1,100.000,yes");
  EXPECT_EQ(tuner.Record(0.6), "1,inplace_threshold,65536,8388608,1,200.000,no");
}

TEST(AutotunerTest, NoBucketCandidateExceedsTheLargestAllowed) {
  for (int64_t largest : {int64_t{0}, int64_t{512} << 10, int64_t{3} << 20}) {
    Autotuner tuner({256 << 10, std::max<int64_t>(largest, 1), 1.0}, largest, kAll);
    std::vector<TunableSettings> tried;
    Tune(
        &tuner, [](const TunableSettings& s) { return 1.0 / double(s.fusion_threshold_bytes); },
        &tried);
    for (const TunableSettings& s : tried) {
      EXPECT_LE(s.fusion_threshold_bytes, std::max<int64_t>(largest, 1)) << largest;
    }
    EXPECT_LE(tuner.current().fusion_threshold_bytes, std::max<int64_t>(largest, 1));
  }
}

TEST(AutotunerTest, LeavesWhatTheUserSetAlone) {
  TunedParameters tuned;
  tuned.inplace_threshold = false;
  tuned.fusion_threshold = false;
  Autotuner tuner(kStart, 64 << 20, tuned);
  std::vector<TunableSettings> tried;
  Tune(
      &tuner, [](const TunableSettings& s) { return s.cycle_time_ms; }, &tried);
  for (const TunableSettings& s : tried) {
    EXPECT_EQ(s.inplace_threshold_bytes, kStart.inplace_threshold_bytes);
    EXPECT_EQ(s.fusion_threshold_bytes, kStart.fusion_threshold_bytes);
  }
  EXPECT_EQ(tuner.current().cycle_time_ms, 0.1);
}

}  // namespace
}  // namespace gradsync
