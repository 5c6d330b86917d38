// CopyTableCache: which batched copies a stream repeats, so that their descriptors (the segments
// and the chunk plan) are written to device memory once and every later launch of the same copy
// passes the kernel only their address.
//
// A locked schedule launches the same buckets over the same gradients step after step, so its
// copies' segments repeat exactly: their descriptors need not travel with every launch, in its
// parameter (up to 3.9 KiB for 96 segments) or through a staging copy.
//
// The policy: a list of segments seen for the first time is launched as it would be without the
// cache. Seen again while it is still among the last kRecentLists lists without a table, it is
// worth a table: the caller uploads it and Inserts it, and every later identical launch on the
// same stream finds it. At most `capacity` tables live; inserting past that retires the least
// recently used one, whose memory the caller may reuse once the launches already queued that
// read it have run (it records that on the table's stream before reusing it).
//
// The device memory is the caller's: a table holds it as an opaque handle.
//
// Thread safety: none; one thread at a time, as the copier that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/device/batched_copy.h"

namespace gradsync {

class CopyTableCache {
 public:
  struct Table {
    uint64_t signature = 0;
    const void* stream = nullptr;
    size_t element_size = 0;
    std::vector<CopySegment> segments;
    std::vector<int64_t> first_chunk;  // PlanCopyChunks of `segments`
    void* memory = nullptr;            // the caller's: where the descriptors are on the device
    uint64_t last_used = 0;
  };

  // What Find learnt about a list of segments.
  struct Lookup {
    const Table* table = nullptr;  // the list's table, or null
    bool worth_a_table = false;    // no table, but the list came recently: Insert one
    uint64_t signature = 0;        // for Insert
  };

  static constexpr size_t kRecentLists = 64;

  explicit CopyTableCache(size_t capacity) : capacity_(capacity) {}

  // Looks `segments` up as a copy of elements of `element_size` bytes launched on `stream`.
  Lookup Find(const std::vector<CopySegment>& segments, size_t element_size, const void* stream);

  // Adds the table Find said was worth one (`lookup`), whose descriptors the caller has put at
  // `memory`. When that passes the capacity, *retired is the least recently used table's memory
  // (it leaves the cache), else null. A table Find returns stays valid until the next Insert.
  void Insert(const Lookup& lookup, const std::vector<CopySegment>& segments, size_t element_size,
              const void* stream, std::vector<int64_t> first_chunk, void* memory, void** retired);

  size_t size() const { return tables_.size(); }

  // The signature Find computes; equal lists have equal signatures.
  static uint64_t Signature(const std::vector<CopySegment>& segments, size_t element_size,
                            const void* stream);

 private:
  size_t capacity_;
  uint64_t clock_ = 0;
  std::vector<Table> tables_;
  uint64_t recent_[kRecentLists] = {};  // signatures of lists without a table; 0 is empty
  size_t next_recent_ = 0;
};

}  // namespace gradsync
