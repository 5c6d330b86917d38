#include "runtime/generated_name.h"

#include <algorithm>
#include <array>
#include <string>

#include "runtime/tensor_entry.h"

namespace gradsync {

namespace {

constexpr std::string_view kMarker = ".noname.";

// Digits only, and no leading zero unless it is the only one: std::to_string's form.
bool IsCanonicalNumber(std::string_view digits) {
  if (digits.empty() || (digits.size() > 1 && digits.front() == '0')) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// "<op>" or "<op>.set<k>", <op> an operation type's name: what GeneratedName puts before kMarker.
bool IsGeneratedStem(std::string_view head) {
  const size_t dot = head.find('.');
  const std::string_view op = head.substr(0, dot);
  // Made once: parsing runs for every generated name a cycle keys.
  static const std::array<std::string, kNumOpTypes> kOps = [] {
    std::array<std::string, kNumOpTypes> ops;
    for (int t = 0; t < kNumOpTypes; ++t) ops[t] = OpTypeName(static_cast<OpType>(t));
    return ops;
  }();
  if (std::find(kOps.begin(), kOps.end(), op) == kOps.end()) return false;
  if (dot == std::string_view::npos) return true;
  const std::string_view set = head.substr(dot + 1);
  return set.substr(0, 3) == "set" && IsCanonicalNumber(set.substr(3)) && set.substr(3) != "0";
}

}  // namespace

std::string GeneratedName(std::string_view op, int32_t process_set, uint64_t n) {
  std::string name(op);
  if (process_set != 0) name += ".set" + std::to_string(process_set);
  name += kMarker;
  name += std::to_string(n);
  return name;
}

bool ParseGeneratedName(std::string_view name, std::string_view* stem, uint64_t* n) {
  size_t digits = 0;
  while (digits < name.size() && digits < 20) {
    const char c = name[name.size() - 1 - digits];
    if (c < '0' || c > '9') break;
    ++digits;
  }
  if (digits == 0 || digits == 20) return false;
  const std::string_view head = name.substr(0, name.size() - digits);
  if (head.size() <= kMarker.size() || head.substr(head.size() - kMarker.size()) != kMarker ||
      !IsCanonicalNumber(name.substr(head.size())) ||
      !IsGeneratedStem(head.substr(0, head.size() - kMarker.size()))) {
    return false;
  }
  uint64_t value = 0;  // at most 19 digits: within uint64_t
  for (char c : name.substr(head.size())) value = value * 10 + static_cast<uint64_t>(c - '0');
  *stem = head;
  *n = value;
  return true;
}

}  // namespace gradsync
