// ProcessSetRegistry: the process sets that exist, their member ranks and this process's place in
// each, for caller threads that validate enqueues. The global set (id 0, every rank) is always
// there. A set that failed (its collectives stalled) stays listed, closed with the failure, until
// it is removed.
//
// Written by init() and by the background thread as sets are added, closed and removed; read from
// any thread. Every member takes one mutex; none blocks otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

struct ProcessSetInfo {
  int32_t id = 0;
  std::vector<int> ranks;  // global ranks, ascending
  int set_rank = -1;       // this process's rank within the set; -1 when not a member
  Status closed;           // not OK once the set has failed
};

class ProcessSetRegistry {
 public:
  void Add(ProcessSetInfo info);
  void Remove(int32_t id);
  void Close(int32_t id, Status reason);

  // This process's rank in set `id` and the set's size; an error naming the set (and its members)
  // when the set does not exist, has failed, or does not include this process. Allocates nothing
  // on success, so enqueues may call it on every tensor.
  Status Membership(int32_t id, int* set_rank, int* set_size) const;
  bool Find(int32_t id, ProcessSetInfo* out) const;
  // The id of the set with exactly these (ascending) ranks, or -1.
  int32_t FindByRanks(const std::vector<int>& ranks) const;
  std::vector<ProcessSetInfo> All() const;

 private:
  mutable std::mutex mu_;
  std::map<int32_t, ProcessSetInfo> sets_;
};

// Checks a member list given by the application: not empty, every rank in [0, world_size), none
// twice. On success *sorted holds the ranks in ascending order.
Status NormalizeProcessSetRanks(const std::vector<int>& ranks, int world_size,
                                std::vector<int>* sorted);

}  // namespace gradsync
