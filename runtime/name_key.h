// NameKey: a tensor name with its hash, computed once per enqueue, for the maps that look every
// tensor up by name on every step (in flight, pending negotiation, response cache). Hashing the
// name again in each of them cost more than any one of the lookups.
//
// A NameKey views its name: it is valid while the string it was made from is unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>

namespace gradsync {

// Eight bytes per step, each mixed by a multiply and a shift, then a final avalanche; inline,
// because the library's string hash is an out-of-line call that cost more than the table probes
// it feeds. Tables use both the low bits (slot) and the high half (tag), which the avalanche mixes.
inline size_t HashName(std::string_view name) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = kMul ^ name.size();
  const char* p = name.data();
  size_t left = name.size();
  for (; left >= 8; p += 8, left -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * kMul;
    h ^= h >> 29;
  }
  // The last 0 to 7 bytes in at most two loads: two overlapping 4-byte words from 4 bytes up, else
  // the first, middle and last byte (the length is already mixed in, so this loses nothing).
  uint64_t tail = 0;
  if (left >= 4) {
    uint32_t head_word, tail_word;
    std::memcpy(&head_word, p, 4);
    std::memcpy(&tail_word, p + left - 4, 4);
    tail = uint64_t{head_word} << 32 | tail_word;
  } else if (left > 0) {
    const auto byte = [p](size_t i) { return uint64_t{static_cast<unsigned char>(p[i])}; };
    tail = byte(0) << 16 | byte(left / 2) << 8 | byte(left - 1);
  }
  h = (h ^ tail) * 0xFF51AFD7ED558CCDull;
  h ^= h >> 32;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  return static_cast<size_t>(h);
}

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
