#include "runtime/spin_window.h"

#include <gtest/gtest.h>

#include <chrono>

namespace gradsync {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(SpinWindowTest, TwiceTheLongestRecentGapBetweenItsBounds) {
  const auto t0 = std::chrono::steady_clock::now();
  SpinWindow spin(microseconds(100), microseconds(1000), microseconds(50));
  EXPECT_EQ(spin.window(), microseconds(100));  // nothing arrived yet
  spin.Arrived(t0);
  EXPECT_EQ(spin.window(), microseconds(100));  // one arrival: no gap yet
  spin.Arrived(t0 + microseconds(20));
  EXPECT_EQ(spin.window(), microseconds(100));  // 40 us: below the shortest
  spin.Arrived(t0 + microseconds(320));
  EXPECT_EQ(spin.window(), microseconds(600));
  spin.Arrived(t0 + microseconds(420));
  EXPECT_EQ(spin.window(), microseconds(600));  // the longest remembered gap counts
  spin.Arrived(t0 + microseconds(920));
  EXPECT_EQ(spin.window(), microseconds(1000));  // 500 us: twice is the longest window
}

TEST(SpinWindowTest, AGapTooLongToSpinThroughDoesNotWidenIt) {
  const auto t0 = std::chrono::steady_clock::now();
  SpinWindow spin(microseconds(100), microseconds(1000), microseconds(50));
  spin.Arrived(t0);
  spin.Arrived(t0 + microseconds(501));  // more than half the longest window
  EXPECT_EQ(spin.window(), microseconds(100));
  spin.Arrived(t0 + milliseconds(20));  // between two steps
  EXPECT_EQ(spin.window(), microseconds(100));
  spin.Arrived(t0 + milliseconds(20) + microseconds(200));
  EXPECT_EQ(spin.window(), microseconds(400));
  spin.Arrived(t0 + milliseconds(40));  // the next step: the step's gaps are still remembered
  EXPECT_EQ(spin.window(), microseconds(400));
}

TEST(SpinWindowTest, ArrivalsThatThinOutNarrowItAgain) {
  auto at = std::chrono::steady_clock::now();
  SpinWindow spin(microseconds(100), microseconds(1000), microseconds(50));
  spin.Arrived(at);
  at += microseconds(300);
  spin.Arrived(at);
  EXPECT_EQ(spin.window(), microseconds(600));
  for (size_t i = 1; i < SpinWindow::kRemembered; ++i) {
    at += milliseconds(3);
    spin.Arrived(at);
    EXPECT_EQ(spin.window(), microseconds(600)) << "after " << i << " long gaps";
  }
  at += milliseconds(3);
  spin.Arrived(at);  // the 300 us gap is no longer among the remembered
  EXPECT_EQ(spin.window(), microseconds(100));
}

TEST(SpinWindowTest, ArrivalsGivenOutOfOrderCountAsNoGap) {
  const auto t0 = std::chrono::steady_clock::now();
  SpinWindow spin(microseconds(100), microseconds(1000), microseconds(50));
  spin.Arrived(t0 + microseconds(50));
  spin.Arrived(t0);
  EXPECT_EQ(spin.window(), microseconds(100));
}

TEST(SpinWindowTest, ALongestBelowTheShortestKeepsTheShortest) {
  const auto t0 = std::chrono::steady_clock::now();
  SpinWindow spin(microseconds(100), microseconds(50), microseconds(50));
  spin.Arrived(t0);
  spin.Arrived(t0 + microseconds(10));
  EXPECT_EQ(spin.window(), microseconds(100));
}

TEST(SpinWindowTest, SpinsThroughTheWindowAfterTheLastWork) {
  const auto t0 = std::chrono::steady_clock::now();
  SpinWindow spin(microseconds(100), microseconds(1000), microseconds(50));
  EXPECT_TRUE(spin.Spins(microseconds(99)));
  EXPECT_FALSE(spin.Spins(microseconds(100)));
  spin.Arrived(t0);
  spin.Arrived(t0 + microseconds(300));
  EXPECT_TRUE(spin.Spins(microseconds(599)));
  EXPECT_FALSE(spin.Spins(microseconds(600)));
}

// Where a yield gave the core to a thread that had work for it, the thread stops spinning past
// the shortest window until work arrives again.
TEST(SpinWindowTest, AYieldThatReturnsLateEndsTheWidenedWindow) {
  const auto t0 = std::chrono::steady_clock::now();
  SpinWindow spin(microseconds(100), microseconds(1000), microseconds(50));
  spin.Arrived(t0);
  spin.Arrived(t0 + microseconds(300));
  spin.Yielded(microseconds(150), microseconds(49));  // nobody else wanted the core
  EXPECT_TRUE(spin.Spins(microseconds(200)));
  spin.Yielded(microseconds(50), microseconds(400));  // within the shortest window: no matter
  EXPECT_TRUE(spin.Spins(microseconds(200)));
  spin.Yielded(microseconds(200), microseconds(50));
  EXPECT_FALSE(spin.Spins(microseconds(250)));
  EXPECT_TRUE(spin.Spins(microseconds(10)));  // the shortest window still holds
  spin.Arrived(t0 + microseconds(600));
  EXPECT_TRUE(spin.Spins(microseconds(250)));
}

// After work that a host thread runs (a bucket whose event tells of its completion), only the
// shortest window holds, whatever the gaps; the next arrival that may widen it widens it again.
TEST(SpinWindowTest, AnArrivalThatMayNotWidenItKeepsTheShortest) {
  const auto t0 = std::chrono::steady_clock::now();
  SpinWindow spin(microseconds(100), microseconds(1000), microseconds(50));
  spin.Arrived(t0);
  spin.Arrived(t0 + microseconds(300), /*may_widen=*/false);
  EXPECT_EQ(spin.window(), microseconds(600));  // the gap still counts
  EXPECT_TRUE(spin.Spins(microseconds(99)));
  EXPECT_FALSE(spin.Spins(microseconds(100)));
  spin.Arrived(t0 + microseconds(600));
  EXPECT_TRUE(spin.Spins(microseconds(500)));
}

}  // namespace
}  // namespace gradsync
