// NameTable: a map from tensor name (NameKey, hash computed once at enqueue) to a small value, for
// the tables that every tensor visits on every step: in flight, pending negotiation, response
// cache.
//
// Items are stored densely, in an order that erasing changes, and found through an open-addressing
// index of 64-bit slots (position and hash tag, linear probing, backward-shift deletion, load at
// most one half). A lookup usually reads one slot and one item and compares the name once; nothing
// is allocated once the table has reached its working size. A NameKey views its name, which must
// outlive the item (as for every NameKey).
//
// Thread safety: none; lock around it as around a std::unordered_map. Insert and erase invalidate
// pointers to items and values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/name_key.h"

namespace gradsync {

template <typename V>
class NameTable {
 public:
  struct Item {
    NameKey key;
    V value;
  };

  // Inserts unless `key` is present; returns whether it did. On failure `value` keeps its contents.
  bool Insert(const NameKey& key, const V& value) { return Insert(key, V(value)); }
  bool Insert(const NameKey& key, V&& value) {
    if ((items_.size() + 1) * 2 > slots_.size()) Grow();
    size_t slot = Home(key.hash);
    for (; slots_[slot] != 0; slot = Next(slot)) {
      if (Matches(slots_[slot], key)) return false;
    }
    items_.push_back(Item{key, std::move(value)});
    slots_[slot] = Pack(key.hash, items_.size() - 1);
    return true;
  }

  V* Find(const NameKey& key) {
    const size_t slot = FindSlot(key);
    return slot == kNone ? nullptr : &items_[PositionOf(slots_[slot])].value;
  }
  const V* Find(const NameKey& key) const { return const_cast<NameTable*>(this)->Find(key); }
  bool Contains(const NameKey& key) const { return FindSlot(key) != kNone; }

  // Removes `key` and returns its value; nullopt when absent.
  std::optional<V> Take(const NameKey& key) {
    const size_t slot = FindSlot(key);
    if (slot == kNone) return std::nullopt;
    std::optional<V> value(std::move(items_[PositionOf(slots_[slot])].value));
    EraseSlot(slot);
    return value;
  }
  // Returns whether `key` was present.
  bool Erase(const NameKey& key) {
    const size_t slot = FindSlot(key);
    if (slot == kNone) return false;
    EraseSlot(slot);
    return true;
  }

  // Removes every item, appending the values to *out in item order. Costs one pass over the index
  // instead of a probe and a backward shift per item.
  void TakeAll(std::vector<V>* out) {
    for (Item& item : items_) out->push_back(std::move(item.value));
    items_.clear();
    std::fill(slots_.begin(), slots_.end(), 0);
  }

  Item* begin() { return items_.data(); }
  Item* end() { return items_.data() + items_.size(); }
  const Item* begin() const { return items_.data(); }
  const Item* end() const { return items_.data() + items_.size(); }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }

 private:
  static constexpr size_t kNone = ~size_t{0};
  static constexpr size_t kFirstSlots = 16;

  // A slot holds the item's position + 1 in its low half (0: empty) and the low half of the key's
  // hash in its high half: most mismatches are rejected, and a slot's home found, without reading
  // the item (the index never reaches 2^32 slots).
  static uint64_t Tag(size_t hash) { return static_cast<uint64_t>(hash) << 32; }
  static uint64_t Pack(size_t hash, size_t position) {
    return Tag(hash) | static_cast<uint32_t>(position + 1);
  }
  static size_t PositionOf(uint64_t slot) { return static_cast<uint32_t>(slot) - 1; }

  size_t Home(size_t hash) const { return hash & (slots_.size() - 1); }
  size_t HomeOfSlot(uint64_t slot) const { return Home(static_cast<size_t>(slot >> 32)); }
  size_t Next(size_t slot) const { return (slot + 1) & (slots_.size() - 1); }
  bool Matches(uint64_t slot, const NameKey& key) const {
    return (slot >> 32) == static_cast<uint32_t>(key.hash) && items_[PositionOf(slot)].key == key;
  }

  size_t FindSlot(const NameKey& key) const {
    if (slots_.empty()) return kNone;
    for (size_t slot = Home(key.hash); slots_[slot] != 0; slot = Next(slot)) {
      if (Matches(slots_[slot], key)) return slot;
    }
    return kNone;
  }

  // The slot that points at item `position`, which must exist.
  size_t SlotOfPosition(size_t position) const {
    size_t slot = Home(items_[position].key.hash);
    while (PositionOf(slots_[slot]) != position) slot = Next(slot);
    return slot;
  }

  void EraseSlot(size_t slot) {
    const size_t position = PositionOf(slots_[slot]);
    // Backward shift: pull later members of the probe run into the hole unless their home lies
    // cyclically after the hole, so that no lookup ever stops early at an empty slot.
    size_t hole = slot;
    for (size_t next = Next(hole); slots_[next] != 0; next = Next(next)) {
      const size_t home = HomeOfSlot(slots_[next]);
      const bool stays =
          hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
      if (stays) continue;
      slots_[hole] = slots_[next];
      hole = next;
    }
    slots_[hole] = 0;
    // Keep the items dense: the last one moves into the erased one's place.
    const size_t last = items_.size() - 1;
    if (position != last) {
      const size_t moved = SlotOfPosition(last);
      items_[position] = std::move(items_[last]);
      slots_[moved] = Pack(items_[position].key.hash, position);
    }
    items_.pop_back();
  }

  void Grow() {
    const size_t capacity = slots_.empty() ? kFirstSlots : slots_.size() * 2;
    slots_.assign(capacity, 0);
    for (size_t position = 0; position < items_.size(); ++position) {
      size_t slot = Home(items_[position].key.hash);
      while (slots_[slot] != 0) slot = Next(slot);
      slots_[slot] = Pack(items_[position].key.hash, position);
    }
  }

  std::vector<Item> items_;
  std::vector<uint64_t> slots_;  // a power of two in size, or empty
};

}  // namespace gradsync
