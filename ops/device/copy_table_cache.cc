#include "ops/device/copy_table_cache.h"

#include <cstring>
#include <utility>

namespace gradsync {
namespace {

// The descriptors are compared and hashed as bytes: a segment is four 8-byte words, no padding.
static_assert(sizeof(CopySegment) == 4 * sizeof(uint64_t), "CopySegment has padding");

uint64_t Mix(uint64_t hash, uint64_t word) {
  hash ^= word;
  hash *= 0x9E3779B97F4A7C15ull;
  return hash ^ (hash >> 29);
}

bool SameSegments(const std::vector<CopySegment>& a, const std::vector<CopySegment>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(CopySegment)) == 0);
}

}  // namespace

uint64_t CopyTableCache::Signature(const std::vector<CopySegment>& segments, size_t element_size,
                                   const void* stream) {
  uint64_t hash = Mix(0x243F6A8885A308D3ull, element_size);
  hash = Mix(hash, reinterpret_cast<uintptr_t>(stream));
  hash = Mix(hash, segments.size());
  const size_t words = segments.size() * sizeof(CopySegment) / sizeof(uint64_t);
  const auto* bytes = reinterpret_cast<const unsigned char*>(segments.data());
  for (size_t i = 0; i < words; ++i) {
    uint64_t word = 0;
    std::memcpy(&word, bytes + i * sizeof(word), sizeof(word));
    hash = Mix(hash, word);
  }
  return hash == 0 ? 1 : hash;  // 0 marks an empty slot of the recent lists
}

CopyTableCache::Lookup CopyTableCache::Find(const std::vector<CopySegment>& segments,
                                            size_t element_size, const void* stream) {
  Lookup lookup;
  if (capacity_ == 0) return lookup;  // tables off: not even a hash
  lookup.signature = Signature(segments, element_size, stream);
  for (Table& table : tables_) {
    if (table.signature == lookup.signature && table.stream == stream &&
        table.element_size == element_size && SameSegments(table.segments, segments)) {
      table.last_used = ++clock_;
      lookup.table = &table;
      return lookup;
    }
  }
  for (uint64_t& recent : recent_) {
    if (recent == lookup.signature) {
      recent = 0;
      lookup.worth_a_table = true;
      return lookup;
    }
  }
  recent_[next_recent_] = lookup.signature;
  next_recent_ = (next_recent_ + 1) % kRecentLists;
  return lookup;
}

void CopyTableCache::Insert(const Lookup& lookup, const std::vector<CopySegment>& segments,
                            size_t element_size, const void* stream,
                            std::vector<int64_t> first_chunk, void* memory, void** retired) {
  *retired = nullptr;
  if (tables_.size() >= capacity_ && !tables_.empty()) {
    size_t oldest = 0;
    for (size_t i = 1; i < tables_.size(); ++i) {
      if (tables_[i].last_used < tables_[oldest].last_used) oldest = i;
    }
    *retired = tables_[oldest].memory;
    tables_[oldest] = std::move(tables_.back());
    tables_.pop_back();
  }
  Table table;
  table.signature = lookup.signature;
  table.stream = stream;
  table.element_size = element_size;
  table.segments = segments;
  table.first_chunk = std::move(first_chunk);
  table.memory = memory;
  table.last_used = ++clock_;
  tables_.push_back(std::move(table));
}

}  // namespace gradsync
