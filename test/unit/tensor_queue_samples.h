// Entries by name for the tensor queue's tests.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/op_state.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

inline std::unique_ptr<TensorEntry> Entry(const std::string& name) {
  auto entry = std::make_unique<TensorEntry>();
  entry->name = name;
  entry->state = std::make_shared<OpState>();
  return entry;
}

inline std::vector<std::unique_ptr<TensorEntry>> Entries(const std::vector<std::string>& names) {
  std::vector<std::unique_ptr<TensorEntry>> entries;
  for (const auto& name : names) entries.push_back(Entry(name));
  return entries;
}

inline std::vector<std::string> Names(const std::vector<TensorEntry*>& entries) {
  std::vector<std::string> names;
  for (const auto& entry : entries) names.push_back(entry->name);
  return names;
}

// Generous enough that a loaded CI machine does not turn "returned early" into a flake.
constexpr std::chrono::milliseconds kLongWait{10000};

}  // namespace gradsync
