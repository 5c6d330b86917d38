// What each soak step does, derived from (seed, step) alone, so that every rank builds the same
// plan without talking to the others; only the order in which a rank submits, and local choices
// such as out-of-place outputs and callbacks, differ per rank.
//
// The pool of tensor names is cut into templates of one to four names, each with a "home" set of
// parameters (collective, process set, reduce op, scales, dtypes, shapes). A step runs a random
// subset of templates, mostly with their home parameters, so the response cache sees hits, and
// sometimes with fresh ones, so it sees misses and replaced entries; with a cache smaller than the
// pool it also sees evictions. Occasional steps instead run a join (ranks running out of work at
// different rounds) or add a process set, use it, and remove it.
//
// In the steady mode (PlannerConfig::steady_steps) the steps come in stretches, as a training
// loop's do: the same allreduces and broadcasts step after step, long enough for the global set
// to lock its schedule, then one step that deviates the way a program may once locked (another
// shape or dtype, a tensor missing on every rank, a new name, one rank late, a join, a process
// set added), then one random step as above.
//
// Thread safety: a Planner is immutable after construction; MakeStep may be called from any
// thread.
#pragma once

#include <gradsync/gradsync.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gradsync {
namespace soak {

// A small deterministic generator (splitmix64), the same on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  int64_t Uniform(int64_t lo, int64_t hi);  // inclusive
  bool Chance(double p);
  template <typename T>
  const T& Pick(const std::vector<T>& items) {
    return items[static_cast<size_t>(Uniform(0, static_cast<int64_t>(items.size()) - 1))];
  }
  template <typename T>
  void Shuffle(std::vector<T>* items) {
    for (size_t i = items->size(); i > 1; --i) {
      std::swap((*items)[i - 1], (*items)[static_cast<size_t>(Uniform(0, i - 1))]);
    }
  }

 private:
  uint64_t state_;
};

enum class Kind { kAllreduce, kAllgather, kBroadcast, kReducescatter, kAlltoall, kBarrier };
std::string KindName(Kind kind);

// How the step after a steady stretch differs from the stretch's steps.
enum class Deviation {
  kNone,             // it does not: one more steady step
  kOtherParameters,  // one operation with fresh parameters (shape, dtype, op, scales, kind)
  kMissing,          // one operation left out, on every rank
  kExtraName,        // one operation more, under a name the stretch does not use
  kLateRank,         // one rank submits its last tensor late
  kJoin,             // a join step instead
  kAddedSet,         // a process set added (and used, and removed) beside the steady operations
};
constexpr int kDeviations = 7;
std::string DeviationName(Deviation deviation);

// One tensor of an operation. Shapes are per kind: allreduce, broadcast and reducescatter use
// `shape` on every member; allgather and alltoall use `rows[m]` (set member m's first dimension)
// followed by `shape` (the other dimensions), except that a scalar allgather has every member
// pass a scalar.
struct TensorPlan {
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> rows;
  bool scalar = false;
  std::vector<std::vector<int64_t>> splits;  // alltoall: [sender member][receiver member]
  uint64_t salt = 0;                         // keys the data, fresh every step
};

struct OpPlan {
  Kind kind = Kind::kAllreduce;
  bool grouped = false;
  int set = 0;  // index into Planner::sets(); sets().size() names the step's added set
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int root = 0;              // broadcast: a rank within the set (passed as its global rank)
  bool even_splits = false;  // alltoall: pass no splits (rows a multiple of the set's size)
  // Empty names: gradsync generates them, matching them across ranks by their order, so these
  // run on the global set and every rank submits them after the named ones, in plan order.
  bool unnamed = false;
  std::vector<TensorPlan> tensors;
};

struct StepPlan {
  int64_t step = 0;
  std::vector<OpPlan> ops;
  // A join step: rank r runs join_rounds[r] rounds of join_ops[round] (global allreduces and
  // barriers), then calls join(). `ops` is empty then.
  bool join = false;
  std::vector<int> join_rounds;
  std::vector<std::vector<OpPlan>> join_ops;
  // Non-empty: add this process set before the ops and remove it after them.
  std::vector<int> added_set;
  // The steady mode: a step of a stretch, or the step after one and how it deviates. A late
  // rank submits its last tensor late_ms after its others.
  bool steady = false;
  bool after_stretch = false;
  Deviation deviation = Deviation::kNone;
  int late_rank = -1;
  int late_ms = 0;
};

struct PlannerConfig {
  uint64_t seed = 1;
  int pool_size = 256;
  int max_ops = 16;
  double join_chance = 0.02;       // of a step being a join step
  double added_set_chance = 0.01;  // of a step adding (and removing) a process set
  double unnamed_chance = 0.2;     // of a step ending with operations left unnamed
  // > 0: the steady mode, stretches of this many identical steps (the global set must be the
  // only set for it to lock).
  int steady_steps = 0;
};

class Planner {
 public:
  // `sets[0]` is the global set (every rank); the others are the sets created at init.
  Planner(const PlannerConfig& config, std::vector<std::vector<int>> sets);
  StepPlan MakeStep(int64_t step) const;
  const std::vector<std::vector<int>>& sets() const { return sets_; }
  // The steady mode's stretches begin every this many steps (0: off).
  int64_t steady_period() const;

 private:
  struct Template {
    std::vector<std::string> names;
    OpPlan home;
  };
  OpPlan RandomOp(Rng* rng, const std::vector<std::string>& names, const std::vector<int>& members,
                  int set) const;
  StepPlan RandomStep(int64_t step) const;
  // A stretch's operations (its salts not yet drawn) and templates it leaves out that it could
  // have held.
  void SteadyOps(int64_t stretch, std::vector<OpPlan>* ops, std::vector<size_t>* spare) const;
  StepPlan SteadyStep(int64_t stretch, int64_t step) const;
  StepPlan DeviationStep(int64_t stretch, int64_t step) const;
  // Per-step parts: data salts, allgather rows, alltoall splits.
  void Refresh(Rng* rng, const std::vector<int>& members, int64_t step, OpPlan* op) const;
  void MakeJoinStep(Rng* rng, StepPlan* plan) const;
  std::vector<int> RandomNewSet(Rng* rng) const;
  const std::vector<int>& Members(int set, const StepPlan& plan) const;

  PlannerConfig config_;
  uint64_t seed_;
  int size_;
  std::vector<std::vector<int>> sets_;
  std::vector<Template> templates_;
};

}  // namespace soak
}  // namespace gradsync
