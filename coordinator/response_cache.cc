#include "coordinator/response_cache.h"

#include <cstdio>
#include <cstdlib>

namespace gradsync {

ResponseCache::ResponseCache(size_t capacity) : capacity_(capacity) {}

bool ResponseCache::IsCacheable(const Response& response) {
  return response.type == ResponseType::kAllreduce || response.type == ResponseType::kBroadcast ||
         response.type == ResponseType::kReducescatter;
}

ResponseCache::Lookup ResponseCache::Find(const NameKey& name, const RequestFields& request,
                                          uint32_t* bit) const {
  const uint32_t* found = by_name_.Find(name);
  if (found == nullptr) return Lookup::kMiss;
  *bit = *found;
  return ParametersMatch(*slots_[*found].response, request) ? Lookup::kHit : Lookup::kMismatch;
}

void ResponseCache::Put(const ResponsePtr& response) {
  if (capacity_ == 0 || !IsCacheable(*response)) return;
  const NameKey key(response->name);
  if (const uint32_t* found = by_name_.Find(key)) {
    // The key must view the name of the response now held, not of the one replaced.
    const uint32_t bit = *found;
    Slot& slot = slots_[bit];
    by_name_.Erase(key);
    slot.response = response;
    slot.key = key;
    by_name_.Insert(key, bit);
    Touch(bit);
    return;
  }
  if (by_name_.size() >= capacity_) Erase(LeastRecentlyUsed());
  const uint32_t bit = TakeFreeBit();
  Slot& slot = slots_[bit];
  slot.used = true;
  slot.response = response;
  slot.key = key;
  slot.last_used = ++clock_;
  by_name_.Insert(key, bit);
}

void ResponseCache::Touch(uint32_t bit) {
  if (Contains(bit)) slots_[bit].last_used = ++clock_;
}

uint32_t ResponseCache::LeastRecentlyUsed() const {
  uint32_t oldest = 0;
  uint64_t oldest_use = ~uint64_t{0};
  for (uint32_t bit = 0; bit < slots_.size(); ++bit) {
    if (slots_[bit].used && slots_[bit].last_used < oldest_use) {
      oldest = bit;
      oldest_use = slots_[bit].last_used;
    }
  }
  return oldest;
}

void ResponseCache::Erase(uint32_t bit) {
  if (!Contains(bit)) return;
  Slot& slot = slots_[bit];
  by_name_.Erase(slot.key);
  slot.used = false;
  slot.key = NameKey();
  slot.response.reset();
  free_bits_.insert(bit);
}

const ResponsePtr& ResponseCache::Get(uint32_t bit) const {
  if (!Contains(bit)) {
    std::fprintf(stderr, "gradsync: internal error: response cache bit %u is empty\n", bit);
    std::abort();
  }
  return slots_[bit].response;
}

ResponsePtr ResponseCache::Share(const Response* response) const {
  const uint32_t* bit = by_name_.Find(NameKey(response->name));
  if (bit == nullptr || slots_[*bit].response.get() != response) return nullptr;
  return slots_[*bit].response;
}

ResponsePtr ResponseCache::Find(const NameKey& name) const {
  const uint32_t* bit = by_name_.Find(name);
  return bit == nullptr ? nullptr : slots_[*bit].response;
}

void ResponseCache::AppendGroupBits(const std::string& group, std::vector<uint32_t>* bits) const {
  for (size_t bit = 0; bit < slots_.size(); ++bit) {
    if (slots_[bit].used && slots_[bit].response->group_size > 1 &&
        slots_[bit].response->group == group) {
      bits->push_back(static_cast<uint32_t>(bit));
    }
  }
}

uint32_t ResponseCache::TakeFreeBit() {
  if (!free_bits_.empty()) {
    const uint32_t bit = *free_bits_.begin();
    free_bits_.erase(free_bits_.begin());
    return bit;
  }
  slots_.emplace_back();
  return static_cast<uint32_t>(slots_.size() - 1);
}

}  // namespace gradsync
