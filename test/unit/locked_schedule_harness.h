// What the locked schedule's unit tests share: responses and entries made from names (those
// starting with "bcast." stand for broadcasts from rank 0), and the outcome of a negotiated cycle.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/locked_schedule.h"
#include "runtime/name_key.h"

namespace gradsync {
namespace locked_test {

constexpr int64_t kElements = 16;  // 64 bytes a tensor

// Names starting with "bcast." stand for broadcasts from rank 0, the rest for allreduces.
inline bool IsBroadcast(const std::string& name) { return name.rfind("bcast.", 0) == 0; }

inline Response AllreduceResponse(const std::string& name, int64_t elements = kElements) {
  Response r;
  r.type = IsBroadcast(name) ? ResponseType::kBroadcast : ResponseType::kAllreduce;
  r.name = name;
  r.shape = {elements};
  return r;
}

inline std::unique_ptr<TensorEntry> EntryFor(const std::string& name, int64_t elements = kElements,
                                             OpType op = OpType::kAllreduce, int root = 0) {
  auto entry = std::make_unique<TensorEntry>();
  entry->name = name;
  entry->name_hash = HashName(name);
  entry->op = IsBroadcast(name) && op == OpType::kAllreduce ? OpType::kBroadcast : op;
  entry->root = root;
  entry->input = TensorView(nullptr, DataType::kFloat32, {elements}, Device());
  return entry;
}

inline std::vector<std::string> Names(int count) {
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.push_back("grad." + std::to_string(i));
  return names;
}

// What a negotiated cycle hands Observe: `names` ran, in that order, each entry enqueued after
// `waits_before[i]` of its caller's waits (none when not given).
class Observed {
 public:
  explicit Observed(const std::vector<std::string>& names,
                    const std::vector<uint64_t>& waits_before = {}) {
    for (size_t i = 0; i < names.size(); ++i) {
      responses_.push_back(std::make_shared<const Response>(AllreduceResponse(names[i])));
      entries_.push_back(EntryFor(names[i]));
      if (i < waits_before.size()) entries_.back()->waits_before = waits_before[i];
    }
  }
  CycleOutcome Outcome() const {
    CycleOutcome outcome;
    for (size_t i = 0; i < responses_.size(); ++i) {
      outcome.responses.push_back(responses_[i].get());
      outcome.entries.push_back(entries_[i].get());
    }
    return outcome;
  }
  LockedSchedule::CachedResponse Cache() const {
    return [this](const std::string& name) -> ResponsePtr {
      for (const ResponsePtr& r : responses_) {
        if (r->name == name) return r;
      }
      return nullptr;
    };
  }

 private:
  std::vector<ResponsePtr> responses_;
  std::vector<std::unique_ptr<TensorEntry>> entries_;
};

inline LockSettings FastSettings(int64_t after_steps = 2) {
  LockSettings s;
  s.after_steps = after_steps;
  s.wait_seconds = 0.05;
  s.stall_warning_seconds = 5.0;
  s.stall_shutdown_seconds = 20.0;
  return s;
}

}  // namespace locked_test
}  // namespace gradsync
