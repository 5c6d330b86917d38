// Step plans for the soak; see soak_plan.h.
#include "test/soak/soak_plan.h"

#include <algorithm>
#include <numeric>

#include "test/soak/soak_values.h"

namespace gradsync {
namespace soak {
namespace {

constexpr double kFreshParametersChance = 0.15;
// A late rank's delay, at most: several GRADSYNC_LOCK_WAIT_MS of the soak's locking test, so that
// some delays outlast the wait and take the set out of the lock and others do not.
constexpr int64_t kLateMsMax = 150;

const std::vector<DataType> kDtypes = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt32,
                                       DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16,
                                       DataType::kFloat32, DataType::kFloat64};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kProduct};

// Names of varied length; a few are long, to stretch the wire format.
std::string PoolName(Rng* rng, int index) {
  std::string name = "soak." + std::to_string(index);
  if (rng->Chance(0.3)) {
    name += '.';
    for (int64_t n = rng->Uniform(1, 40); n > 0; --n)
      name += static_cast<char>('a' + rng->Next() % 26);
  }
  if (rng->Chance(0.02)) name += std::string(static_cast<size_t>(rng->Uniform(500, 3000)), 'L');
  return name;
}

// A whole tensor's shape: scalars, empty tensors, small odd shapes, medium and (rarely) large
// ones; large ones are above the in-place threshold for 4- and 8-byte dtypes.
std::vector<int64_t> FullShape(Rng* rng, bool allow_scalar) {
  const int64_t r = rng->Uniform(0, 99);
  if (allow_scalar && r < 8) return {};
  if (r < 97 && r >= 82) {
    if (rng->Chance(0.5)) return {rng->Uniform(100, 5000)};
    return {rng->Uniform(2, 9), rng->Uniform(20, 600)};
  }
  if (r >= 97) {
    if (rng->Chance(0.5)) return {rng->Uniform(65537, 100003)};
    return {rng->Uniform(2, 4), rng->Uniform(20000, 40000)};
  }
  std::vector<int64_t> shape(static_cast<size_t>(rng->Uniform(1, 3)));
  for (int64_t& d : shape) d = rng->Uniform(1, 6);
  if (r < 16) shape[static_cast<size_t>(rng->Uniform(0, shape.size() - 1))] = 0;
  return shape;
}

// The dimensions after the first, for collectives whose first dimension differs per rank.
std::vector<int64_t> TrailingShape(Rng* rng) {
  std::vector<int64_t> shape(static_cast<size_t>(rng->Uniform(0, 2)));
  for (int64_t& d : shape) d = rng->Chance(0.04) ? 0 : rng->Uniform(1, 5);
  return shape;
}

// Rows divided as evenly as possible, lower ranks taking the remainder.
std::vector<int64_t> EvenSplit(int64_t rows, int n) {
  std::vector<int64_t> parts(static_cast<size_t>(n), rows / n);
  for (int64_t i = 0; i < rows % n; ++i) ++parts[static_cast<size_t>(i)];
  return parts;
}

}  // namespace

uint64_t Rng::Next() {
  state_ += 0x9E3779B97F4A7C15ull;
  return Mix(state_, 0);
}

int64_t Rng::Uniform(int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
}

bool Rng::Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }

std::string KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReducescatter:
      return "reducescatter";
    case Kind::kAlltoall:
      return "alltoall";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

std::string DeviationName(Deviation deviation) {
  switch (deviation) {
    case Deviation::kNone:
      return "none";
    case Deviation::kOtherParameters:
      return "other parameters";
    case Deviation::kMissing:
      return "a tensor missing";
    case Deviation::kExtraName:
      return "a new name";
    case Deviation::kLateRank:
      return "a late rank";
    case Deviation::kJoin:
      return "join";
    case Deviation::kAddedSet:
      return "a process set added";
  }
  return "?";
}

Planner::Planner(const PlannerConfig& config, std::vector<std::vector<int>> sets)
    : config_(config),
      seed_(config.seed),
      size_(static_cast<int>(sets.at(0).size())),
      sets_(std::move(sets)) {
  Rng rng(Mix(seed_, 0x7e3a1a7e));
  for (int next = 0; next < config_.pool_size;) {
    Template t;
    const int64_t count = rng.Chance(0.25) ? rng.Uniform(2, 4) : 1;
    for (int64_t i = 0; i < count && next < config_.pool_size; ++i)
      t.names.push_back(PoolName(&rng, next++));
    const int set = sets_.size() > 1 && rng.Chance(0.3)
                        ? static_cast<int>(rng.Uniform(1, static_cast<int64_t>(sets_.size()) - 1))
                        : 0;
    t.home = RandomOp(&rng, t.names, sets_[static_cast<size_t>(set)], set);
    templates_.push_back(std::move(t));
  }
}

OpPlan Planner::RandomOp(Rng* rng, const std::vector<std::string>& names,
                         const std::vector<int>& members, int set) const {
  OpPlan op;
  op.set = set;
  const int n = static_cast<int>(members.size());
  const int64_t k = rng->Uniform(0, 99);
  if (names.size() > 1) {
    op.grouped = true;
    op.kind = k < 60 ? Kind::kAllreduce : k < 80 ? Kind::kAllgather : Kind::kReducescatter;
  } else {
    op.kind = k < 40   ? Kind::kAllreduce
              : k < 53 ? Kind::kAllgather
              : k < 65 ? Kind::kBroadcast
              : k < 80 ? Kind::kReducescatter
              : k < 93 ? Kind::kAlltoall
                       : Kind::kBarrier;
  }
  op.op = rng->Pick(kOps);
  if (op.kind == Kind::kAllreduce || op.kind == Kind::kReducescatter) {
    if (op.op != ReduceOp::kProduct) op.prescale = rng->Pick(std::vector<double>{1, 1, 1, 2, 0.5});
    op.postscale = rng->Pick(std::vector<double>{1, 1, 1, 2, 0.5, 0.25});
  }
  op.root = static_cast<int>(rng->Uniform(0, n - 1));
  op.even_splits = rng->Chance(0.15);
  for (const std::string& name : names) {
    TensorPlan t;
    t.name = name;
    t.dtype = rng->Pick(kDtypes);
    switch (op.kind) {
      case Kind::kAllreduce:
      case Kind::kBroadcast:
        t.shape = FullShape(rng, true);
        break;
      case Kind::kReducescatter:
        t.shape = FullShape(rng, false);
        if (rng->Chance(0.3)) t.shape[0] = rng->Uniform(0, 2 * n + 1);
        break;
      case Kind::kAllgather:
        t.scalar = rng->Chance(0.06);
        if (!t.scalar) t.shape = TrailingShape(rng);
        break;
      case Kind::kAlltoall:
        t.shape = TrailingShape(rng);
        break;
      case Kind::kBarrier:
        break;
    }
    op.tensors.push_back(std::move(t));
  }
  return op;
}

void Planner::Refresh(Rng* rng, const std::vector<int>& members, int64_t step, OpPlan* op) const {
  const int n = static_cast<int>(members.size());
  for (size_t i = 0; i < op->tensors.size(); ++i) {
    TensorPlan& t = op->tensors[i];
    t.salt = Mix(Mix(seed_, static_cast<uint64_t>(step)), rng->Next() + i);
    const bool large = rng->Chance(0.03);
    if (op->kind == Kind::kAllgather) {
      t.rows.resize(static_cast<size_t>(n));
      for (int64_t& r : t.rows)
        r = t.scalar ? 1 : large ? rng->Uniform(2000, 20000) : rng->Uniform(0, 4);
    } else if (op->kind == Kind::kAlltoall) {
      t.splits.assign(static_cast<size_t>(n), {});
      t.rows.resize(static_cast<size_t>(n));
      for (int s = 0; s < n; ++s) {
        if (op->even_splits) {
          // Without splits the rows must divide among the members (as Horovod requires).
          t.splits[s] = EvenSplit(n * rng->Uniform(0, 2), n);
        } else {
          t.splits[s].resize(static_cast<size_t>(n));
          for (int64_t& x : t.splits[s]) x = large ? rng->Uniform(0, 3000) : rng->Uniform(0, 3);
        }
        t.rows[s] = std::accumulate(t.splits[s].begin(), t.splits[s].end(), int64_t{0});
      }
    }
  }
}

const std::vector<int>& Planner::Members(int set, const StepPlan& plan) const {
  return set < static_cast<int>(sets_.size()) ? sets_[static_cast<size_t>(set)] : plan.added_set;
}

std::vector<int> Planner::RandomNewSet(Rng* rng) const {
  for (int attempt = 0; attempt < 32; ++attempt) {
    std::vector<int> ranks;
    for (int r = 0; r < size_; ++r) {
      if (rng->Chance(0.5)) ranks.push_back(r);
    }
    if (ranks.size() < 2 || static_cast<int>(ranks.size()) == size_) continue;
    if (std::find(sets_.begin(), sets_.end(), ranks) == sets_.end()) return ranks;
  }
  return {};
}

int64_t Planner::steady_period() const {
  // The stretch, the step that deviates, and one random step.
  return config_.steady_steps > 0 ? config_.steady_steps + 2 : 0;
}

StepPlan Planner::MakeStep(int64_t step) const {
  const int64_t period = steady_period();
  if (period > 0 && step % period < config_.steady_steps) return SteadyStep(step / period, step);
  if (period > 0 && step % period == config_.steady_steps) {
    return DeviationStep(step / period, step);
  }
  return RandomStep(step);
}

void Planner::SteadyOps(int64_t stretch, std::vector<OpPlan>* ops,
                        std::vector<size_t>* spare) const {
  // The collectives a locked plan holds, on the global set.
  std::vector<size_t> eligible;
  for (size_t i = 0; i < templates_.size(); ++i) {
    const OpPlan& home = templates_[i].home;
    if (home.set == 0 && (home.kind == Kind::kAllreduce || home.kind == Kind::kBroadcast)) {
      eligible.push_back(i);
    }
  }
  Rng rng(Mix(seed_ ^ 0x57eadull, static_cast<uint64_t>(stretch)));
  rng.Shuffle(&eligible);
  const size_t count =
      std::min(eligible.size(), static_cast<size_t>(rng.Uniform(2, std::max(2, config_.max_ops))));
  ops->clear();
  for (size_t i = 0; i < count; ++i) ops->push_back(templates_[eligible[i]].home);
  spare->assign(eligible.begin() + static_cast<std::ptrdiff_t>(count), eligible.end());
  // Some stretches end every step with unnamed operations, as a loop that averages its loss does:
  // their generated names are new at every call, and the lock places them by their order. Drawn
  // apart, so that the rest of the plan is the same with or without them.
  Rng unnamed(Mix(seed_ ^ 0x6e6f6e616d65ull, static_cast<uint64_t>(stretch)));
  if (unnamed.Chance(config_.unnamed_chance)) {
    for (int64_t i = unnamed.Uniform(1, 2); i > 0 && !spare->empty(); --i) {
      OpPlan op = templates_[spare->back()].home;
      spare->pop_back();
      op.unnamed = true;  // a group too: known by its first member's generated name
      for (TensorPlan& tensor : op.tensors) tensor.name.clear();
      ops->push_back(std::move(op));
    }
  }
}

StepPlan Planner::SteadyStep(int64_t stretch, int64_t step) const {
  StepPlan plan;
  plan.step = step;
  plan.steady = true;
  std::vector<size_t> spare;
  SteadyOps(stretch, &plan.ops, &spare);
  Rng rng(Mix(seed_, static_cast<uint64_t>(step) + 1));
  for (OpPlan& op : plan.ops) Refresh(&rng, sets_[0], step, &op);  // fresh data every step
  return plan;
}

StepPlan Planner::DeviationStep(int64_t stretch, int64_t step) const {
  StepPlan plan;
  plan.step = step;
  plan.after_stretch = true;
  std::vector<size_t> spare;
  SteadyOps(stretch, &plan.ops, &spare);
  Rng rng(Mix(seed_, static_cast<uint64_t>(step) + 1));
  plan.deviation = static_cast<Deviation>(rng.Uniform(0, kDeviations - 1));
  // Where this world or stretch cannot deviate so, the step changes one operation's parameters.
  if ((plan.deviation == Deviation::kJoin && size_ < 2) ||
      (plan.deviation == Deviation::kMissing && plan.ops.size() < 2) ||
      ((plan.deviation == Deviation::kExtraName || plan.deviation == Deviation::kAddedSet) &&
       spare.empty())) {
    plan.deviation = Deviation::kOtherParameters;
  }
  if (plan.deviation == Deviation::kAddedSet) {
    plan.added_set = RandomNewSet(&rng);
    if (plan.added_set.empty()) plan.deviation = Deviation::kOtherParameters;
  }
  const size_t pick =
      static_cast<size_t>(rng.Uniform(0, static_cast<int64_t>(plan.ops.size()) - 1));
  switch (plan.deviation) {
    case Deviation::kNone:
      plan.steady = true;
      break;
    case Deviation::kOtherParameters: {
      std::vector<std::string> names;
      for (const TensorPlan& t : plan.ops[pick].tensors) names.push_back(t.name);
      plan.ops[pick] = RandomOp(&rng, names, sets_[0], 0);
      break;
    }
    case Deviation::kMissing:
      plan.ops.erase(plan.ops.begin() + static_cast<std::ptrdiff_t>(pick));
      break;
    case Deviation::kExtraName:
      plan.ops.insert(plan.ops.begin() + static_cast<std::ptrdiff_t>(pick),
                      templates_[spare.front()].home);
      break;
    case Deviation::kLateRank:
      plan.late_rank = static_cast<int>(rng.Uniform(0, size_ - 1));
      plan.late_ms = static_cast<int>(rng.Uniform(0, kLateMsMax));
      break;
    case Deviation::kJoin:
      plan.ops.clear();
      MakeJoinStep(&rng, &plan);
      return plan;
    case Deviation::kAddedSet:
      // Its first operations, on names the stretch leaves out.
      for (size_t i = 0; i < spare.size() && i < 3; ++i) {
        plan.ops.insert(plan.ops.begin(), RandomOp(&rng, templates_[spare[i]].names, plan.added_set,
                                                   static_cast<int>(sets_.size())));
      }
      break;
  }
  for (OpPlan& op : plan.ops) Refresh(&rng, Members(op.set, plan), step, &op);
  return plan;
}

StepPlan Planner::RandomStep(int64_t step) const {
  Rng rng(Mix(seed_, static_cast<uint64_t>(step) + 1));
  StepPlan plan;
  plan.step = step;
  if (step > 0 && size_ > 1 && rng.Chance(config_.join_chance)) {
    MakeJoinStep(&rng, &plan);
    return plan;
  }
  if (step > 0 && size_ >= 3 && rng.Chance(config_.added_set_chance))
    plan.added_set = RandomNewSet(&rng);
  std::vector<size_t> order(templates_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  rng.Shuffle(&order);
  const int64_t count =
      std::min<int64_t>(rng.Uniform(1, config_.max_ops), static_cast<int64_t>(order.size()));
  for (int64_t i = 0; i < count; ++i) {
    const Template& t = templates_[order[static_cast<size_t>(i)]];
    OpPlan op;
    if (!plan.added_set.empty() && i < 3) {
      op = RandomOp(&rng, t.names, plan.added_set, static_cast<int>(sets_.size()));
    } else if (rng.Chance(kFreshParametersChance)) {
      const int set = sets_.size() > 1 && rng.Chance(0.3)
                          ? static_cast<int>(rng.Uniform(1, static_cast<int64_t>(sets_.size()) - 1))
                          : 0;
      op = RandomOp(&rng, t.names, sets_[static_cast<size_t>(set)], set);
    } else {
      op = t.home;
    }
    Refresh(&rng, Members(op.set, plan), step, &op);
    plan.ops.push_back(std::move(op));
  }
  // Every generated name is new, so these also show whether gradsync forgets names it made up.
  if (rng.Chance(config_.unnamed_chance)) {
    for (int64_t i = rng.Uniform(1, 2); i > 0; --i) {
      OpPlan op = RandomOp(&rng, {""}, sets_[0], 0);
      op.unnamed = true;
      Refresh(&rng, sets_[0], step, &op);
      plan.ops.push_back(std::move(op));
    }
  }
  return plan;
}

void Planner::MakeJoinStep(Rng* rng, StepPlan* plan) const {
  plan->join = true;
  plan->join_rounds.resize(static_cast<size_t>(size_));
  for (int& r : plan->join_rounds) r = static_cast<int>(rng->Uniform(0, 3));
  const int most = *std::max_element(plan->join_rounds.begin(), plan->join_rounds.end());
  if (most == 0) plan->join_rounds[static_cast<size_t>(rng->Uniform(0, size_ - 1))] = 1;
  const int rounds = std::max(most, 1);
  std::vector<size_t> order(templates_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  rng->Shuffle(&order);
  size_t next = 0;
  plan->join_ops.resize(static_cast<size_t>(rounds));
  for (auto& round : plan->join_ops) {
    for (int64_t i = rng->Uniform(1, 4); i > 0 && next < order.size(); --i) {
      const Template& t = templates_[order[next++]];
      OpPlan op;
      op.set = 0;
      op.grouped = t.names.size() > 1;
      op.kind = !op.grouped && rng->Chance(0.15) ? Kind::kBarrier : Kind::kAllreduce;
      op.op = rng->Pick(kOps);
      // Scale factors apply to a joined rank's identity too; they are meant for sum and average.
      if (op.op == ReduceOp::kSum || op.op == ReduceOp::kAverage) {
        op.prescale = rng->Pick(std::vector<double>{1, 2, 0.5});
        op.postscale = rng->Pick(std::vector<double>{1, 2, 0.5, 0.25});
      }
      for (const std::string& name : t.names) {
        TensorPlan tensor;
        tensor.name = name;
        tensor.dtype = rng->Pick(kDtypes);
        if (op.kind == Kind::kAllreduce) tensor.shape = FullShape(rng, true);
        tensor.salt = Mix(Mix(seed_, static_cast<uint64_t>(plan->step)), rng->Next());
        op.tensors.push_back(std::move(tensor));
      }
      round.push_back(std::move(op));
    }
  }
}

}  // namespace soak
}  // namespace gradsync
