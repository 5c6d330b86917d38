#include "runtime/recycling_map.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace gradsync {
namespace {

TEST(RecyclingMapTest, InsertFindTake) {
  RecyclingMap<std::string, int> map;
  EXPECT_TRUE(map.Insert("a", 1));
  EXPECT_TRUE(map.Insert("b", 2));
  EXPECT_EQ(map.size(), 2u);
  ASSERT_NE(map.find("a"), map.end());
  EXPECT_EQ(map.find("a")->second, 1);
  EXPECT_EQ(map.Take("a"), 1);
  EXPECT_EQ(map.Take("a"), std::nullopt);
  EXPECT_EQ(map.count("a"), 0u);
  EXPECT_EQ(map.size(), 1u);
}

// Once a key was taken, later inserts reuse its node; the values must still be the new ones.
TEST(RecyclingMapTest, ReusedNodesHoldTheNewKeyAndValue) {
  RecyclingMap<std::string, int> map;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 10; ++i) EXPECT_TRUE(map.Insert("k" + std::to_string(i), round * 100 + i));
    for (int i = 9; i >= 0; --i) EXPECT_EQ(map.Take("k" + std::to_string(i)), round * 100 + i);
    EXPECT_TRUE(map.empty());
  }
}

TEST(RecyclingMapTest, FailedInsertLeavesTheValueWithTheCaller) {
  RecyclingMap<std::string, std::unique_ptr<int>> map;
  ASSERT_TRUE(map.Insert("x", std::make_unique<int>(1)));
  auto second = std::make_unique<int>(2);
  EXPECT_FALSE(map.Insert("x", std::move(second)));  // fresh node path
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(*second, 2);

  ASSERT_TRUE(map.Insert("y", std::make_unique<int>(3)));
  EXPECT_EQ(*map.Take("y").value(), 3);              // leaves a spare node
  EXPECT_FALSE(map.Insert("x", std::move(second)));  // spare node path
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(*second, 2);
  EXPECT_EQ(*map.find("x")->second, 1);
}

}  // namespace
}  // namespace gradsync
