// UnnamedPlan and StepKey: how the locked schedule recognizes operations enqueued without a name
// from one step to the next (docs/protocol.md, "Locked schedule").
//
// gradsync names such an operation "<op>.noname.<n>" (runtime/generated_name.h), n counting this
// process's unnamed operations of that type and set, so the name is new at every call, and a loop
// with an unnamed allreduce in each step (a loss averaged for logging) never repeated a step and
// never locked. What does repeat is the name's stem and n's place in the step: every rank issues
// its unnamed operations in one order (negotiation pairs them by n on that promise), so the k-th
// unnamed allreduce of one step stands where the k-th of the next one does. StepKey gives each
// observed name a key that repeats from step to step; UnnamedPlan maps a locked plan's generated
// names to their slots by n, so every rank puts the same operation in the same slot whatever
// order its entries reach the lock in.
//
// Thread safety: none; each belongs to one LockedSchedule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gradsync {

// The key of a generated name's stem at a place in a plan: what the plan's fingerprint takes.
uint64_t StemKey(std::string_view stem, uint64_t place);

// What an observed step counts `name` as: its hash, or for a generated name (`*generated` set)
// the hash of its stem, the same at every call. A step's generated names are counted as a
// multiset of stems and parameters, free of the order negotiation happened to run them in: where
// they go in a plan is decided by their numbers, which follow the program's order.
uint64_t StepKey(std::string_view name, bool* generated);

// What a step and a plan take for the group of the tensor named `name`: the group's hash, or for
// a group of unnamed operations, which is known by its first member's generated name and so is
// new at every call as they are, the member's distance from that first member, which repeats.
uint64_t GroupKey(std::string_view group, std::string_view name);

class UnnamedPlan {
 public:
  // From the plan's step, `names[0..count)` in the order they ran. False when a stem's numbers in
  // it are not consecutive (the same on every rank: the names are): the step cannot be a plan.
  bool Build(const std::vector<std::string>& names, size_t count);
  bool empty() const { return stems_.empty(); }
  // Whether `name` is generated; if so, `*slot` is the index into the plan's step of the place it
  // takes, or -1 when the plan holds no name of its stem or its number comes before the plan's.
  bool Find(std::string_view name, int64_t* slot) const;
  // The key the plan's fingerprint takes for `name`: StemKey for a planned generated name (its
  // place in the step, by number), else the name's hash.
  uint64_t KeyOf(std::string_view name) const;

 private:
  struct Stem {
    std::string stem;
    uint64_t first = 0;              // the smallest number the plan's step holds
    std::vector<size_t> step_index;  // by number - first: the name's index in the plan's step
  };
  const Stem* FindStem(std::string_view stem) const;

  std::vector<Stem> stems_;
};

}  // namespace gradsync
