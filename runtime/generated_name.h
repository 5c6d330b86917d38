// The names gradsync gives operations enqueued without one: "<op>.noname.<n>" in the global
// process set, "<op>.set<k>.noname.<n>" in process set k, where n counts this process's accepted
// unnamed operations of that type in that set. Every rank that issues its unnamed operations in
// the same order gives the same operation the same name, which is how negotiation pairs them.
// Such a name is new at every call: what repeats from one step to the next is its stem (all but
// n), and n's place among the step's names of that stem, which the locked schedule matches on.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gradsync {

std::string GeneratedName(std::string_view op, int32_t process_set, uint64_t n);

// Whether `name` is one GeneratedName makes (an operation type's name, a set other than 0, n
// without leading zeros); if so, `stem` views all of it but the trailing n (ending in
// ".noname.") and `n` is that number. A user's name of another form is never taken for one.
bool ParseGeneratedName(std::string_view name, std::string_view* stem, uint64_t* n);

}  // namespace gradsync
