#include "runtime/name_table.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace gradsync {
namespace {

TEST(NameTableTest, InsertFindTake) {
  const std::string a = "a", b = "b";
  NameTable<int> table;
  EXPECT_TRUE(table.Insert(NameKey(a), 1));
  EXPECT_TRUE(table.Insert(NameKey(b), 2));
  EXPECT_EQ(table.size(), 2u);
  ASSERT_NE(table.Find(NameKey(a)), nullptr);
  EXPECT_EQ(*table.Find(NameKey(a)), 1);
  EXPECT_EQ(table.Take(NameKey(a)), 1);
  EXPECT_EQ(table.Take(NameKey(a)), std::nullopt);
  EXPECT_FALSE(table.Contains(NameKey(a)));
  EXPECT_TRUE(table.Contains(NameKey(b)));
  EXPECT_FALSE(table.Erase(NameKey(a)));
  EXPECT_TRUE(table.Erase(NameKey(b)));
  EXPECT_TRUE(table.empty());
}

TEST(NameTableTest, TakeAllEmptiesTheTableAndKeepsItUsable) {
  std::vector<std::string> names;
  for (int i = 0; i < 100; ++i) names.push_back("t" + std::to_string(i));
  NameTable<int> table;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(table.Insert(NameKey(names[i]), i));
  std::vector<int> taken = {-1};
  table.TakeAll(&taken);
  ASSERT_EQ(taken.size(), 101u);  // appended
  EXPECT_EQ(taken[0], -1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(taken[i + 1], i);  // item order: insertion order here
  EXPECT_TRUE(table.empty());
  for (const std::string& name : names) EXPECT_FALSE(table.Contains(NameKey(name))) << name;
  EXPECT_TRUE(table.Insert(NameKey(names[7]), 7));
  EXPECT_EQ(*table.Find(NameKey(names[7])), 7);
}

TEST(NameTableTest, EmptyTableFindsNothing) {
  const NameTable<int> table;
  const std::string a = "a";
  EXPECT_EQ(table.Find(NameKey(a)), nullptr);
  EXPECT_EQ(table.begin(), table.end());
}

TEST(NameTableTest, FailedInsertLeavesTheValueWithTheCaller) {
  const std::string a = "a";
  NameTable<std::unique_ptr<int>> table;
  EXPECT_TRUE(table.Insert(NameKey(a), std::make_unique<int>(1)));
  auto second = std::make_unique<int>(2);
  EXPECT_FALSE(table.Insert(NameKey(a), std::move(second)));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(*second, 2);
  EXPECT_EQ(**table.Find(NameKey(a)), 1);
}

// Equal hashes force every key into one probe run, so erasing from its middle must shift the rest
// back; names that differ only after equal hashes must still be told apart.
TEST(NameTableTest, CollidingHashesStayFindableAcrossErases) {
  std::vector<std::string> names;
  for (int i = 0; i < 12; ++i) names.push_back("n" + std::to_string(i));
  auto key = [&](int i) { return NameKey(names[i], 42); };
  NameTable<int> table;
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(table.Insert(key(i), i));
  for (int i = 0; i < 12; i += 3) ASSERT_TRUE(table.Erase(key(i)));
  for (int i = 0; i < 12; ++i) {
    const int* value = table.Find(key(i));
    if (i % 3 == 0) {
      EXPECT_EQ(value, nullptr) << names[i];
    } else {
      ASSERT_NE(value, nullptr) << names[i];
      EXPECT_EQ(*value, i);
    }
  }
}

// Random inserts and takes against std::map, with hashes folded into few values so that probe
// runs wrap around the end of the index and cross each other.
TEST(NameTableTest, AgreesWithStdMapUnderRandomChurn) {
  std::vector<std::string> names;
  for (int i = 0; i < 300; ++i) names.push_back("tensor." + std::to_string(i));
  auto key = [&](int i) {
    return NameKey(names[i],
                   HashName(names[i]) % 7 * 0x9e3779b97f4a7c15ull + (i % 5 == 0 ? 15 : 0));
  };
  std::mt19937 rng(7);
  NameTable<int> table;
  std::map<int, int> reference;
  for (int step = 0; step < 20000; ++step) {
    const int i = static_cast<int>(rng() % names.size());
    if (rng() % 2 == 0) {
      EXPECT_EQ(table.Insert(key(i), step), reference.emplace(i, step).second);
    } else {
      auto it = reference.find(i);
      const std::optional<int> taken = table.Take(key(i));
      ASSERT_EQ(taken.has_value(), it != reference.end());
      if (it != reference.end()) {
        EXPECT_EQ(*taken, it->second);
        reference.erase(it);
      }
    }
    ASSERT_EQ(table.size(), reference.size());
  }
  for (const auto& [i, value] : reference) {
    const int* found = table.Find(key(i));
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(*found, value);
  }
  std::map<std::string, int> iterated;
  for (const auto& [name, value] : table) iterated.emplace(std::string(name.name), value);
  EXPECT_EQ(iterated.size(), reference.size());
  for (const auto& [i, value] : reference) EXPECT_EQ(iterated[names[i]], value);
}

}  // namespace
}  // namespace gradsync
