// CopyTableCache: a copy earns a table the second time it comes, is found from then on only when
// every descriptor, the element size and the stream match, and the least recently used table
// leaves first.
#include "ops/device/copy_table_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace gradsync {
namespace {

char memory[1 << 12];

// `n` segments from `memory`, different for each `variant`.
std::vector<CopySegment> Segments(int n, int variant = 0) {
  std::vector<CopySegment> segments;
  for (int i = 0; i < n; ++i) {
    segments.push_back({memory + i, memory + 2048 + i + variant, 100 + i, 1.0});
  }
  return segments;
}

const void* const kStream = reinterpret_cast<const void*>(0x1000);
void* const kTableMemory = reinterpret_cast<void*>(0x2000);

// Finds `segments` twice and inserts the table the second Find asks for, with `memory`.
void Earn(CopyTableCache* cache, const std::vector<CopySegment>& segments, void* memory,
          void** retired) {
  const CopyTableCache::Lookup first = cache->Find(segments, 4, kStream);
  ASSERT_EQ(first.table, nullptr);
  ASSERT_FALSE(first.worth_a_table);
  const CopyTableCache::Lookup second = cache->Find(segments, 4, kStream);
  ASSERT_TRUE(second.worth_a_table);
  ASSERT_EQ(second.table, nullptr);
  cache->Insert(second, segments, 4, kStream,
                PlanCopyChunks(segments.data(), static_cast<int>(segments.size()), 4), memory,
                retired);
}

TEST(CopyTableCacheTest, ASecondSightingEarnsATableThatLaterLaunchesFind) {
  CopyTableCache cache(8);
  const std::vector<CopySegment> segments = Segments(24);
  void* retired = nullptr;
  Earn(&cache, segments, kTableMemory, &retired);  // not worth one the first time
  EXPECT_EQ(retired, nullptr);
  EXPECT_EQ(cache.size(), 1u);
  for (int launch = 0; launch < 3; ++launch) {
    const CopyTableCache::Lookup found = cache.Find(segments, 4, kStream);
    ASSERT_NE(found.table, nullptr);
    EXPECT_FALSE(found.worth_a_table);
    EXPECT_EQ(found.table->memory, kTableMemory);
    EXPECT_EQ(found.table->first_chunk, PlanCopyChunks(segments.data(), 24, 4));
  }
}

TEST(CopyTableCacheTest, ATableServesOnlyTheSameCopyOnTheSameStream) {
  CopyTableCache cache(8);
  const std::vector<CopySegment> segments = Segments(24);
  void* retired = nullptr;
  Earn(&cache, segments, kTableMemory, &retired);
  EXPECT_EQ(cache.Find(segments, 2, kStream).table, nullptr) << "another element size";
  EXPECT_EQ(cache.Find(segments, 4, nullptr).table, nullptr) << "another stream";
  EXPECT_EQ(cache.Find(Segments(23), 4, kStream).table, nullptr) << "one segment fewer";
  std::vector<CopySegment> changed = segments;
  changed[23].src = memory + 100;
  EXPECT_EQ(cache.Find(changed, 4, kStream).table, nullptr) << "a source moved";
  changed = segments;
  changed[0].dst = memory + 3000;
  EXPECT_EQ(cache.Find(changed, 4, kStream).table, nullptr) << "a destination moved";
  changed = segments;
  changed[5].count += 1;
  EXPECT_EQ(cache.Find(changed, 4, kStream).table, nullptr) << "a count changed";
  changed = segments;
  changed[7].scale = 0.5;
  EXPECT_EQ(cache.Find(changed, 4, kStream).table, nullptr) << "a scale changed";
  EXPECT_NE(cache.Find(segments, 4, kStream).table, nullptr);
}

TEST(CopyTableCacheTest, PastItsCapacityTheLeastRecentlyUsedTableIsRetired) {
  constexpr int kCapacity = 4;
  CopyTableCache cache(kCapacity);
  char handles[kCapacity + 1];
  void* retired = nullptr;
  for (int t = 0; t < kCapacity; ++t) {
    Earn(&cache, Segments(8, t), handles + t, &retired);
    EXPECT_EQ(retired, nullptr);
  }
  // Table 0 is used again, so table 1 is now the least recently used.
  ASSERT_NE(cache.Find(Segments(8, 0), 4, kStream).table, nullptr);
  Earn(&cache, Segments(8, kCapacity), handles + kCapacity, &retired);
  EXPECT_EQ(retired, handles + 1);
  EXPECT_EQ(cache.size(), static_cast<size_t>(kCapacity));
  EXPECT_EQ(cache.Find(Segments(8, 1), 4, kStream).table, nullptr);
  for (int t : {0, 2, 3, kCapacity}) {
    const CopyTableCache::Lookup found = cache.Find(Segments(8, t), 4, kStream);
    ASSERT_NE(found.table, nullptr) << "table " << t;
    EXPECT_EQ(found.table->memory, handles + t);
  }
}

TEST(CopyTableCacheTest, NoCapacityMeansNoTables) {
  CopyTableCache cache(0);
  const std::vector<CopySegment> segments = Segments(30);
  for (int launch = 0; launch < 4; ++launch) {
    const CopyTableCache::Lookup found = cache.Find(segments, 4, kStream);
    EXPECT_EQ(found.table, nullptr);
    EXPECT_FALSE(found.worth_a_table);
  }
}

// A copy that comes back only after kRecentLists others has been forgotten: copies that never
// repeat within a step's worth of launches do not fill the cache.
TEST(CopyTableCacheTest, ACopyForgottenAmongManyOthersStartsAgain) {
  CopyTableCache cache(8);
  const std::vector<CopySegment> rare = Segments(16, 1000);
  EXPECT_FALSE(cache.Find(rare, 4, kStream).worth_a_table);
  for (size_t other = 0; other < CopyTableCache::kRecentLists; ++other) {
    EXPECT_FALSE(cache.Find(Segments(16, static_cast<int>(other)), 4, kStream).worth_a_table);
  }
  EXPECT_FALSE(cache.Find(rare, 4, kStream).worth_a_table);
  EXPECT_TRUE(cache.Find(rare, 4, kStream).worth_a_table);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(CopyTableCacheTest, SignaturesOfEqualListsAreEqualAndNeverZero) {
  EXPECT_EQ(CopyTableCache::Signature(Segments(10), 4, kStream),
            CopyTableCache::Signature(Segments(10), 4, kStream));
  EXPECT_NE(CopyTableCache::Signature(Segments(10), 4, kStream),
            CopyTableCache::Signature(Segments(10, 1), 4, kStream));
  EXPECT_NE(CopyTableCache::Signature({}, 4, kStream), 0u);
  EXPECT_NE(CopyTableCache::Signature({}, 0, nullptr), 0u);
}

}  // namespace
}  // namespace gradsync
