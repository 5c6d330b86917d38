// NameKey: a tensor name with its hash, computed once per enqueue, for the maps that look every
// tensor up by name on every step (in flight, pending negotiation, response cache). Hashing the
// name again in each of them cost more than any one of the lookups.
//
// A NameKey views its name: it is valid while the string it was made from is unchanged.
#pragma once

#include <cstddef>
#include <cstring>
#include <functional>
#include <string_view>

namespace gradsync {

inline size_t HashName(std::string_view name) { return std::hash<std::string_view>()(name); }

struct NameKey {
  std::string_view name;
  size_t hash = 0;

  NameKey() = default;
  explicit NameKey(std::string_view n) : name(n), hash(HashName(n)) {}
  // `h` must be HashName(n).
  NameKey(std::string_view n, size_t h) : name(n), hash(h) {}

  // Sizes and bytes compared directly: string_view's operator== was an out-of-line call on the
  // path every tensor takes several times per step.
  bool operator==(const NameKey& o) const {
    return hash == o.hash && name.size() == o.name.size() &&
           std::memcmp(name.data(), o.name.data(), name.size()) == 0;
  }
  bool operator!=(const NameKey& o) const { return !(*this == o); }
};

struct NameKeyHash {
  size_t operator()(const NameKey& key) const { return key.hash; }
};

}  // namespace gradsync
