#include "coordinator/response_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <random>
#include <string>

namespace gradsync {
namespace {

ResponsePtr Cached(const std::string& name, int64_t n = 4,
                   ResponseType type = ResponseType::kAllreduce) {
  Response r;
  r.name = name;
  r.type = type;
  r.shape = {n};
  return std::make_shared<const Response>(std::move(r));
}

Request Asked(const std::string& name, int64_t n = 4) {
  Request r;
  r.name = name;
  r.shape = {n};
  return r;
}

ResponseCache::Lookup Find(const ResponseCache& cache, const Request& request, uint32_t* bit) {
  return cache.Find(NameKey(request.name), FieldsOf(request), bit);
}

TEST(ResponseCacheTest, HitMissAndMismatch) {
  ResponseCache cache(8);
  cache.Put(Cached("a"));
  uint32_t bit = 99;
  EXPECT_EQ(Find(cache, Asked("a"), &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(bit, 0u);
  EXPECT_EQ(Find(cache, Asked("a", 5), &bit), ResponseCache::Lookup::kMismatch);
  EXPECT_EQ(Find(cache, Asked("b"), &bit), ResponseCache::Lookup::kMiss);
}

TEST(ResponseCacheTest, BitsAreAssignedInPutOrderAndReusedSmallestFirst) {
  ResponseCache cache(8);
  for (const char* n : {"a", "b", "c"}) cache.Put(Cached(n));
  uint32_t bit;
  ASSERT_EQ(Find(cache, Asked("c"), &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(bit, 2u);
  cache.Erase(0);
  cache.Erase(1);
  cache.Put(Cached("d"));
  ASSERT_EQ(Find(cache, Asked("d"), &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(bit, 0u);
  EXPECT_EQ(cache.num_bits(), 3u);
}

TEST(ResponseCacheTest, EvictsLeastRecentlyUsed) {
  ResponseCache cache(2);
  cache.Put(Cached("a"));
  cache.Put(Cached("b"));
  cache.Touch(0);  // "a" is now the most recently used
  cache.Put(Cached("c"));
  uint32_t bit;
  EXPECT_EQ(Find(cache, Asked("a"), &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(Find(cache, Asked("b"), &bit), ResponseCache::Lookup::kMiss);
  EXPECT_EQ(Find(cache, Asked("c"), &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(bit, 1u);
  EXPECT_EQ(cache.size(), 2u);
}

// Random puts, touches and erases against a plain list of names, most recent first: the cache must
// evict exactly the names the list says are least recently used.
TEST(ResponseCacheTest, EvictionFollowsRecencyUnderRandomChurn) {
  constexpr size_t kCapacity = 16;
  ResponseCache cache(kCapacity);
  std::list<std::string> recency;  // front = most recently used
  std::mt19937 random(7);
  for (int step = 0; step < 20000; ++step) {
    const std::string name = "t" + std::to_string(random() % 40);
    uint32_t bit = 0;
    const bool cached = Find(cache, Asked(name), &bit) == ResponseCache::Lookup::kHit;
    ASSERT_EQ(cached, std::find(recency.begin(), recency.end(), name) != recency.end()) << name;
    recency.remove(name);
    switch (random() % 3) {
      case 0:  // put (or refresh)
        cache.Put(Cached(name));
        if (recency.size() == kCapacity) recency.pop_back();
        recency.push_front(name);
        break;
      case 1:  // touch, if cached
        if (cached) {
          cache.Touch(bit);
          recency.push_front(name);
        }
        break;
      default:  // erase, if cached
        if (cached) cache.Erase(bit);
        break;
    }
    ASSERT_EQ(cache.size(), recency.size());
  }
}

TEST(ResponseCacheTest, RefreshingANameKeepsItsBit) {
  ResponseCache cache(4);
  cache.Put(Cached("a", 4));
  cache.Put(Cached("a", 8));
  uint32_t bit;
  EXPECT_EQ(Find(cache, Asked("a", 8), &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(bit, 0u);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ResponseCacheTest, OnlyAllreduceAndBroadcastAreCached) {
  ResponseCache cache(4);
  cache.Put(Cached("g", 4, ResponseType::kAllgather));
  cache.Put(Cached("e", 4, ResponseType::kError));
  EXPECT_EQ(cache.size(), 0u);
}

TEST(ResponseCacheTest, ZeroCapacityCachesNothing) {
  ResponseCache cache(0);
  cache.Put(Cached("a"));
  uint32_t bit;
  EXPECT_EQ(Find(cache, Asked("a"), &bit), ResponseCache::Lookup::kMiss);
  EXPECT_EQ(cache.num_bits(), 0u);
}

}  // namespace
}  // namespace gradsync
