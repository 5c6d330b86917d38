#include "runtime/cpu_list.h"

#include <algorithm>
#include <charconv>
#include <iterator>

namespace gradsync {
namespace {

// The largest CPU number accepted: far beyond any node, small enough that a typo fails.
constexpr int kMaxCpu = 1 << 16;

bool ParseCpu(std::string_view text, int* out) {
  if (text.empty() || text.front() < '0' || text.front() > '9') return false;
  auto result = std::from_chars(text.data(), text.data() + text.size(), *out);
  return result.ec == std::errc() && result.ptr == text.data() + text.size() && *out <= kMaxCpu;
}

}  // namespace

CpuList::CpuList(std::vector<int> cpus) : cpus_(std::move(cpus)) {
  std::sort(cpus_.begin(), cpus_.end());
  cpus_.erase(std::unique(cpus_.begin(), cpus_.end()), cpus_.end());
}

Status CpuList::Parse(std::string_view text, CpuList* out) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("CPU list '" + std::string(text) + "': " + why);
  };
  if (text.empty()) return bad("empty");
  std::vector<int> cpus;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const size_t dash = item.find('-');
    int first = 0;
    int last = 0;
    if (dash == std::string_view::npos) {
      if (!ParseCpu(item, &first)) return bad("'" + std::string(item) + "' is not a CPU number");
      last = first;
    } else if (!ParseCpu(item.substr(0, dash), &first) || !ParseCpu(item.substr(dash + 1), &last) ||
               last < first) {
      return bad("'" + std::string(item) + "' is not an ascending range of CPU numbers");
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
    start = comma + 1;
  }
  *out = CpuList(std::move(cpus));
  return Status::OK();
}

bool CpuList::Contains(int cpu) const {
  return std::binary_search(cpus_.begin(), cpus_.end(), cpu);
}

bool CpuList::Intersects(const CpuList& other) const { return !Intersection(other).empty(); }

bool CpuList::IsSubsetOf(const CpuList& other) const {
  return std::includes(other.cpus_.begin(), other.cpus_.end(), cpus_.begin(), cpus_.end());
}

CpuList CpuList::Union(const CpuList& other) const {
  CpuList result;
  std::set_union(cpus_.begin(), cpus_.end(), other.cpus_.begin(), other.cpus_.end(),
                 std::back_inserter(result.cpus_));
  return result;
}

CpuList CpuList::Intersection(const CpuList& other) const {
  CpuList result;
  std::set_intersection(cpus_.begin(), cpus_.end(), other.cpus_.begin(), other.cpus_.end(),
                        std::back_inserter(result.cpus_));
  return result;
}

CpuList CpuList::Minus(const CpuList& other) const {
  CpuList result;
  std::set_difference(cpus_.begin(), cpus_.end(), other.cpus_.begin(), other.cpus_.end(),
                      std::back_inserter(result.cpus_));
  return result;
}

std::string CpuList::ToString() const {
  std::string text;
  for (size_t i = 0; i < cpus_.size();) {
    size_t j = i;
    while (j + 1 < cpus_.size() && cpus_[j + 1] == cpus_[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cpus_[i]);
    if (j > i) text += '-' + std::to_string(cpus_[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace gradsync
