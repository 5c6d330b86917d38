// ResponseCache: responses already negotiated, each under a bit that is the same on every rank.
//
// Every rank holds an identical cache because it is changed only by Put/Erase/Touch calls made in
// the same order on every rank (the order of the cycle's responses and invalid bits). Bits are
// reused smallest-first and the least recently used entry is evicted when full, both deterministic.
// Only allreduce, reducescatter and broadcast responses are cacheable: their parameters repeat
// every step, while an allgather's or alltoall's per-rank sizes may change.
//
// Owned and used by the background thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coordinator/message.h"
#include "runtime/name_table.h"

namespace gradsync {

class ResponseCache {
 public:
  enum class Lookup { kMiss, kHit, kMismatch };

  explicit ResponseCache(size_t capacity);

  static bool IsCacheable(const Response& response);

  // kHit (and *bit) when `name` is cached with exactly the parameters of `request`; kMismatch
  // (and *bit) when it is cached with others; kMiss otherwise. `name` is request.name with its
  // hash.
  Lookup Find(const NameKey& name, const RequestFields& request, uint32_t* bit) const;
  // Caches a cacheable response (refreshing it if the name is present), evicting the least recently
  // used entry when full. A no-op for capacity 0 or an uncacheable response.
  void Put(const ResponsePtr& response);
  // Marks `bit` most recently used.
  void Touch(uint32_t bit);
  void Erase(uint32_t bit);
  const ResponsePtr& Get(uint32_t bit) const;
  // A shared reference to the cached response at `response`; null if it is not in the cache.
  ResponsePtr Share(const Response* response) const;
  // The cached response named `name`; null if none.
  ResponsePtr Find(const NameKey& name) const;
  // The cached response's name with its hash; the bit must be in use.
  const NameKey& KeyOf(uint32_t bit) const { return slots_[bit].key; }
  bool Contains(uint32_t bit) const { return bit < slots_.size() && slots_[bit].used; }
  // Appends the bits of every cached response of `group` (scans the whole cache).
  void AppendGroupBits(const std::string& group, std::vector<uint32_t>* bits) const;

  // One past the highest bit ever handed out: the length of every rank's bit vector.
  size_t num_bits() const { return slots_.size(); }
  size_t size() const { return by_name_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  // Recency is a stamp per slot, from a counter that every Put and Touch advances: touching a
  // cached tensor, which happens for every tensor of every step, is one store. Eviction, which
  // happens only when the cache is full, scans for the smallest stamp. Stamps are unique, so every
  // rank evicts the same entry.
  struct Slot {
    bool used = false;
    ResponsePtr response;
    NameKey key;  // views response->name
    uint64_t last_used = 0;
  };

  uint32_t TakeFreeBit();
  uint32_t LeastRecentlyUsed() const;

  size_t capacity_;
  std::vector<Slot> slots_;
  std::set<uint32_t> free_bits_;
  uint64_t clock_ = 0;
  NameTable<uint32_t> by_name_;  // keys view the slots' names
};

}  // namespace gradsync
