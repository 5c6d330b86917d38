#include "runtime/process_set_registry.h"

#include <algorithm>

#include "runtime/logging.h"

namespace gradsync {

void ProcessSetRegistry::Add(ProcessSetInfo info) {
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t id = info.id;
  sets_[id] = std::move(info);
}

void ProcessSetRegistry::Remove(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_.erase(id);
}

void ProcessSetRegistry::Close(int32_t id, Status reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it != sets_.end()) it->second.closed = std::move(reason);
}

Status ProcessSetRegistry::Membership(int32_t id, int* set_rank, int* set_size) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return Status::InvalidArgument("process set " + std::to_string(id) +
                                   " does not exist (never added, or removed)");
  }
  const ProcessSetInfo& info = it->second;
  if (!info.closed.ok()) {
    return Status(info.closed.code(),
                  "process set " + std::to_string(id) +
                      " failed earlier and takes no more operations: " + info.closed.message());
  }
  if (info.set_rank < 0) {
    return Status::InvalidArgument("this rank is not a member of process set " +
                                   std::to_string(id) + " (ranks " + RankListString(info.ranks) +
                                   ")");
  }
  *set_rank = info.set_rank;
  *set_size = static_cast<int>(info.ranks.size());
  return Status::OK();
}

bool ProcessSetRegistry::Find(int32_t id, ProcessSetInfo* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return false;
  *out = it->second;
  return true;
}

int32_t ProcessSetRegistry::FindByRanks(const std::vector<int>& ranks) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, info] : sets_) {
    if (info.ranks == ranks) return id;
  }
  return -1;
}

std::vector<ProcessSetInfo> ProcessSetRegistry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ProcessSetInfo> out;
  for (const auto& [id, info] : sets_) out.push_back(info);
  return out;
}

Status NormalizeProcessSetRanks(const std::vector<int>& ranks, int world_size,
                                std::vector<int>* sorted) {
  if (ranks.empty()) return Status::InvalidArgument("a process set needs at least one rank");
  std::vector<int> out = ranks;
  std::sort(out.begin(), out.end());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] < 0 || out[i] >= world_size) {
      return Status::InvalidArgument("rank " + std::to_string(out[i]) + " is outside [0, " +
                                     std::to_string(world_size) + ")");
    }
    if (i > 0 && out[i] == out[i - 1]) {
      return Status::InvalidArgument("rank " + std::to_string(out[i]) + " is listed twice");
    }
  }
  *sorted = std::move(out);
  return Status::OK();
}

}  // namespace gradsync
