#include "coordinator/response_cache.h"

#include <gtest/gtest.h>

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
