#include "runtime/cpu_list.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

CpuList Parsed(const std::string& text) {
  CpuList cpus;
  const Status status = CpuList::Parse(text, &cpus);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return cpus;
}

TEST(CpuListTest, ParsesNumbersAndRangesInAnyOrder) {
  EXPECT_EQ(Parsed("0-3,8").cpus(), (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(Parsed("8,2,0-1,2").cpus(), (std::vector<int>{0, 1, 2, 8}));
  EXPECT_EQ(Parsed("5-5").cpus(), (std::vector<int>{5}));
}

TEST(CpuListTest, RejectsMalformedLists) {
  for (const char* bad : {"", ",", "1,", "a", "-1", "3-1", "1-", "1 ,2", "0x1", "99999999"}) {
    CpuList cpus;
    EXPECT_EQ(CpuList::Parse(bad, &cpus).code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CpuListTest, FormatsRangesCompactly) {
  EXPECT_EQ(CpuList().ToString(), "");
  EXPECT_EQ(CpuList({3}).ToString(), "3");
  EXPECT_EQ(CpuList({0, 1, 2, 3, 8, 10, 11}).ToString(), "0-3,8,10-11");
  EXPECT_EQ(Parsed(Parsed("0-2,4,6-7").ToString()), Parsed("0-2,4,6-7"));
}

TEST(CpuListTest, SetOperations) {
  const CpuList a = Parsed("0-3");
  const CpuList b = Parsed("2-5");
  EXPECT_EQ(a.Union(b), Parsed("0-5"));
  EXPECT_EQ(a.Intersection(b), Parsed("2-3"));
  EXPECT_EQ(a.Minus(b), Parsed("0-1"));
  EXPECT_TRUE(a.Intersects(b));
  EXPECT_FALSE(a.Intersects(Parsed("4-5")));
  EXPECT_TRUE(Parsed("1-2").IsSubsetOf(a));
  EXPECT_FALSE(b.IsSubsetOf(a));
  EXPECT_TRUE(CpuList().IsSubsetOf(a));
  EXPECT_TRUE(a.Contains(3));
  EXPECT_FALSE(a.Contains(4));
}

}  // namespace
}  // namespace gradsync
