#include "coordinator/unnamed_plan.h"

#include <algorithm>

#include "runtime/generated_name.h"
#include "runtime/name_key.h"

namespace gradsync {

uint64_t StemKey(std::string_view stem, uint64_t place) {
  uint64_t h = HashName(stem) ^ (place + 0x9E3779B97F4A7C15ull);
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 32);
}

uint64_t StepKey(std::string_view name, bool* generated) {
  std::string_view stem;
  uint64_t n = 0;
  *generated = ParseGeneratedName(name, &stem, &n);
  return HashName(*generated ? stem : name);
}

uint64_t GroupKey(std::string_view group, std::string_view name) {
  std::string_view group_stem, stem;
  uint64_t first = 0, n = 0;
  if (!ParseGeneratedName(group, &group_stem, &first) || !ParseGeneratedName(name, &stem, &n) ||
      stem != group_stem || n < first) {
    return HashName(group);
  }
  return StemKey(stem, n - first);
}

bool UnnamedPlan::Build(const std::vector<std::string>& names, size_t count) {
  stems_.clear();
  struct Seen {
    size_t stem;  // index into stems_
    uint64_t n;
    size_t index;  // into names
  };
  std::vector<Seen> seen;
  std::vector<size_t> per_stem;
  for (size_t i = 0; i < count; ++i) {
    std::string_view stem;
    uint64_t n = 0;
    if (!ParseGeneratedName(names[i], &stem, &n)) continue;
    const Stem* known = FindStem(stem);
    const size_t k = known == nullptr ? stems_.size() : static_cast<size_t>(known - stems_.data());
    if (known == nullptr) {
      stems_.push_back(Stem{std::string(stem), n, {}});
      per_stem.push_back(0);
    }
    stems_[k].first = std::min(stems_[k].first, n);
    ++per_stem[k];
    seen.push_back({k, n, i});
  }
  for (size_t k = 0; k < stems_.size(); ++k) stems_[k].step_index.assign(per_stem[k], count);
  for (const Seen& x : seen) {
    Stem& s = stems_[x.stem];
    const uint64_t offset = x.n - s.first;
    if (offset >= s.step_index.size() || s.step_index[offset] != count) {
      stems_.clear();  // a gap or a repeat: not one loop's numbering
      return false;
    }
    s.step_index[offset] = x.index;
  }
  return true;
}

const UnnamedPlan::Stem* UnnamedPlan::FindStem(std::string_view stem) const {
  for (const Stem& s : stems_) {
    if (s.stem == stem) return &s;
  }
  return nullptr;
}

bool UnnamedPlan::Find(std::string_view name, int64_t* slot) const {
  std::string_view stem;
  uint64_t n = 0;
  if (!ParseGeneratedName(name, &stem, &n)) return false;
  const Stem* s = FindStem(stem);
  *slot = s == nullptr || n < s->first
              ? -1
              : static_cast<int64_t>(s->step_index[(n - s->first) % s->step_index.size()]);
  return true;
}

uint64_t UnnamedPlan::KeyOf(std::string_view name) const {
  std::string_view stem;
  uint64_t n = 0;
  if (!ParseGeneratedName(name, &stem, &n)) return HashName(name);
  const Stem* s = FindStem(stem);
  if (s == nullptr || n < s->first) return HashName(name);
  return StemKey(stem, (n - s->first) % s->step_index.size());
}

}  // namespace gradsync
