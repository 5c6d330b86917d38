#include "runtime/query_pacer.h"

#include <gtest/gtest.h>

#include <chrono>

namespace gradsync {
namespace {

using std::chrono::milliseconds;

TEST(QueryPacerTest, LooksLessOftenTheLongerAWaitLasts) {
  using std::chrono::microseconds;
  using std::chrono::nanoseconds;
  const auto added = std::chrono::steady_clock::now();
  QueryPacer pacer(added);
  EXPECT_TRUE(pacer.Due(added));
  pacer.Looked(added);  // the shortest gap: half a microsecond
  EXPECT_FALSE(pacer.Due(added + nanoseconds(400)));
  EXPECT_TRUE(pacer.Due(added + nanoseconds(500)));
  pacer.Looked(added + microseconds(160));  // a sixteenth of the time in flight
  EXPECT_EQ(pacer.next(), added + microseconds(170));
  pacer.Looked(added + std::chrono::seconds(3));  // the longest: a millisecond
  EXPECT_EQ(pacer.next(), added + std::chrono::seconds(3) + milliseconds(1));
  // Looking whenever due: about 100 looks in the first millisecond, about 14 more in each of
  // the next ten, then one a millisecond.
  QueryPacer counted(added);
  auto count_until = [&](std::chrono::steady_clock::duration end) {
    int looks = 0;
    while (counted.next() < added + end) {
      counted.Looked(counted.next());
      ++looks;
    }
    return looks;
  };
  const int first_ms = count_until(milliseconds(1));
  EXPECT_GE(first_ms, 90);
  EXPECT_LE(first_ms, 100);
  const int to_16_ms = count_until(milliseconds(16));
  EXPECT_GE(to_16_ms, 40);
  EXPECT_LE(to_16_ms, 50);
  EXPECT_EQ(count_until(milliseconds(26)), 10);
}

// A producer's event is looked at no sooner than kProducerGap apart: about 35 looks in the first
// millisecond where the shortest gap of half a microsecond makes about 95, and about 85 in 20 ms.
TEST(QueryPacerTest, AProducersEventIsLookedAtLessOftenAtFirst) {
  const auto since = std::chrono::steady_clock::now();
  QueryPacer pacer(since, kProducerGap);
  pacer.Looked(since);
  EXPECT_EQ(pacer.next(), since + kProducerGap);
  pacer.Looked(since + milliseconds(2));  // past 320 us a sixteenth of the wait, as before
  EXPECT_EQ(pacer.next(), since + milliseconds(2) + std::chrono::microseconds(125));
  auto looks_until = [&](std::chrono::steady_clock::duration end) {
    QueryPacer counted(since, kProducerGap);
    int looks = 0;
    while (counted.next() < since + end) {
      counted.Looked(counted.next());
      ++looks;
    }
    return looks;
  };
  EXPECT_GE(looks_until(milliseconds(1)), 30);
  EXPECT_LE(looks_until(milliseconds(1)), 40);
  EXPECT_GE(looks_until(milliseconds(20)), 75);
  EXPECT_LE(looks_until(milliseconds(20)), 90);
}

TEST(QueryPacerTest, PauseUntilReturnsNoSoonerThanAsked) {
  for (auto pause : {std::chrono::microseconds(0), std::chrono::microseconds(30),
                     std::chrono::microseconds(300)}) {
    const auto until = std::chrono::steady_clock::now() + pause;
    PauseUntil(until);
    EXPECT_GE(std::chrono::steady_clock::now(), until);
  }
}

}  // namespace
}  // namespace gradsync
