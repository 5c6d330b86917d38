#include "runtime/generated_name.h"

namespace gradsync {

namespace {
constexpr std::string_view kMarker = ".noname.";
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
  if (head.size() <= kMarker.size() || head.substr(head.size() - kMarker.size()) != kMarker) {
    return false;
  }
  uint64_t value = 0;  // at most 19 digits: within uint64_t
  for (char c : name.substr(head.size())) value = value * 10 + static_cast<uint64_t>(c - '0');
  *stem = head;
  *n = value;
  return true;
}

}  // namespace gradsync
