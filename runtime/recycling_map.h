// RecyclingMap: a hash map that keeps the nodes of erased elements for later inserts, so a map
// whose contents cycle (the same tensors in flight every training step) stops allocating once it
// has reached its working size.
//
// Thread safety: none; lock around it as around a std::unordered_map.
#pragma once

#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gradsync {

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class RecyclingMap {
 public:
  using Map = std::unordered_map<Key, Value, Hash>;
  using iterator = typename Map::iterator;
  using const_iterator = typename Map::const_iterator;

  // Inserts unless `key` is present; returns whether it did. On failure `value` keeps its contents.
  bool Insert(const Key& key, Value&& value) {
    if (spare_.empty()) return map_.try_emplace(key, std::move(value)).second;
    typename Map::node_type node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = key;
    node.mapped() = std::move(value);
    auto result = map_.insert(std::move(node));
    if (result.inserted) return true;
    value = std::move(result.node.mapped());
    spare_.push_back(std::move(result.node));
    return false;
  }

  // Removes `key` and returns its value; nullopt when absent.
  std::optional<Value> Take(const Key& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return Take(it);
  }
  Value Take(const_iterator it) {
    typename Map::node_type node = map_.extract(it);
    Value value = std::move(node.mapped());
    spare_.push_back(std::move(node));
    return value;
  }

  iterator find(const Key& key) { return map_.find(key); }
  const_iterator find(const Key& key) const { return map_.find(key); }
  size_t count(const Key& key) const { return map_.count(key); }
  iterator begin() { return map_.begin(); }
  iterator end() { return map_.end(); }
  const_iterator begin() const { return map_.begin(); }
  const_iterator end() const { return map_.end(); }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }

 private:
  Map map_;
  std::vector<typename Map::node_type> spare_;
};

}  // namespace gradsync
