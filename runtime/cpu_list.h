// CpuList: a set of logical CPUs (the operating system's processor numbers), as affinity masks,
// launcher bindings and GRADSYNC_THREAD_AFFINITY name them, written the way Linux's cpulist files
// are ("0-3,8,10-11").
//
// Thread safety: a value; distinct objects may be used from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

class CpuList {
 public:
  CpuList() = default;
  explicit CpuList(std::vector<int> cpus);

  // Parses "0-3,8" (numbers and ascending ranges, comma-separated, in any order). Empty text,
  // negative numbers, descending ranges and stray characters are InvalidArgument.
  static Status Parse(std::string_view text, CpuList* out);

  const std::vector<int>& cpus() const { return cpus_; }
  bool empty() const { return cpus_.empty(); }
  int size() const { return static_cast<int>(cpus_.size()); }
  bool Contains(int cpu) const;
  bool Intersects(const CpuList& other) const;
  bool IsSubsetOf(const CpuList& other) const;
  CpuList Union(const CpuList& other) const;
  CpuList Intersection(const CpuList& other) const;
  CpuList Minus(const CpuList& other) const;
  // "0-3,8"; "" when empty.
  std::string ToString() const;

  bool operator==(const CpuList& other) const { return cpus_ == other.cpus_; }
  bool operator!=(const CpuList& other) const { return cpus_ != other.cpus_; }

 private:
  std::vector<int> cpus_;  // ascending, no duplicates
};

}  // namespace gradsync
