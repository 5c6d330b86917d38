// The public C++ API's process sets and join: operations that change which ranks take part.
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "bindings/runtime.h"
#include "coordinator/process_sets.h"
#include "ops/mpi/caller_allreduce.h"
#include "runtime/caller_lanes.h"
#include "runtime/logging.h"
#include "runtime/op_state.h"

namespace gradsync {

Status AddDeclaredProcessSets(Runtime& rt, const std::vector<std::vector<int>>& declared) {
  std::vector<int64_t> flat = {static_cast<int64_t>(declared.size())};
  for (const std::vector<int>& ranks : declared) {
    flat.push_back(static_cast<int64_t>(ranks.size()));
    flat.insert(flat.end(), ranks.begin(), ranks.end());
  }
  GRADSYNC_RETURN_IF_ERROR(
      CheckSameOnEveryRank(rt.mpi->control_comm(), flat, "init: InitOptions::process_sets"));
  for (size_t i = 0; i < declared.size(); ++i) {
    std::vector<int> sorted;
    Status status = NormalizeProcessSetRanks(declared[i], rt.mpi->size(), &sorted);
    int32_t id = 0;
    if (status.ok()) status = rt.loop->AddProcessSet(sorted, &id);
    if (!status.ok()) {
      return Status(status.code(), "init: process set " + std::to_string(i) +
                                       " of InitOptions::process_sets: " + status.message());
    }
  }
  return Status::OK();
}

ProcessSet MakeProcessSet(int id) {
  ProcessSet set;
  set.id_ = id;
  return set;
}

namespace {

// The counters behind generated names: the global set's unnamed operations by type, then the
// process-set changes.
std::vector<int64_t> NameCounters(const Runtime& rt) {
  std::vector<int64_t> counters;
  counters.reserve(kNumOpTypes + 1);
  for (const std::atomic<uint64_t>& counter : rt.unnamed_counters) {
    counters.push_back(static_cast<int64_t>(counter.load()));
  }
  counters.push_back(static_cast<int64_t>(rt.process_set_calls.load()));
  return counters;
}

void RaiseTo(std::atomic<uint64_t>* counter, int64_t agreed) {
  uint64_t seen = counter->load();
  while (seen < static_cast<uint64_t>(agreed) &&
         !counter->compare_exchange_weak(seen, static_cast<uint64_t>(agreed))) {
  }
}

// join()'s part in the caller lanes (runtime/caller_lanes.h): each global-set lane this rank
// holds takes part once in the others' reduction on it, with the identity and the flag that hands
// the bucket back to negotiation on every rank. Returns once each has.
void TakePartInLanesOnJoin(Runtime& rt) {
  std::vector<CallerLane*> granted;
  rt.lanes->ForEach([&](CallerLane* lane) {
    if (lane->process_set == 0 && lane->comm.load() != MPI_COMM_NULL) granted.push_back(lane);
  });
  if (granted.empty()) return;
  // The join goes out in a negotiation round before the others can finish a step with this
  // rank's part in it (ReduceOnLane waits a round after that).
  rt.loop->WaitForFreshCycle();
  // One thread each: the others may reach their lanes in any order.
  auto take_part = [](CallerLane* lane) {
    const size_t element = DataTypeSize(lane->dtype);
    std::vector<unsigned char> identity(static_cast<size_t>(lane->elements) * element, 0);
    std::vector<unsigned char> staging;
    HostSegment piece{identity.data(), lane->elements};
    bool flagged = false;
    // Not watched: a joined rank waiting for the others is no stall, however long they train.
    const Status status = AllreduceOnLane(&piece, 1, {lane->dtype, ReduceOp::kSum, 1.0, 1.0},
                                          /*flag=*/true, lane->comm.load(), lane->piece_bytes,
                                          "join's part in " + lane->name, &staging, &flagged);
    if (!status.ok()) {
      lane->failed = true;
      Log().error("{}", status.ToString());
    }
    ReleaseLaneComm(lane);
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < granted.size(); ++i) threads.emplace_back(take_part, granted[i]);
  take_part(granted[0]);
  for (std::thread& t : threads) t.join();
}

}  // namespace

int join() {
  RequireCallerThread("join");
  Runtime& rt = ActiveRuntime("join");
  // One join per rank at a time, so a fixed name pairs up every rank's join.
  auto entry = NewEntry(rt, OpType::kJoin, "gradsync.join", nullptr);
  // A joined rank serves the others' unnamed allreduces and barriers without naming them, so its
  // counters fall behind theirs: the join agrees on the highest (see ExecuteBucket), and every
  // rank's next unnamed operation gets the same name again.
  entry->splits = NameCounters(rt);
  std::shared_ptr<OpState> state = entry->state;
  Handle joined = Submit(rt, std::move(entry), Status::OK());
  // After the join is submitted, so that this rank's stand-ins serve the others' negotiated
  // buckets while it takes part in their lanes.
  TakePartInLanesOnJoin(rt);
  joined.wait();
  const std::vector<int64_t>& agreed = state->received_splits;
  if (agreed.size() == static_cast<size_t>(kNumOpTypes) + 1) {
    for (int op = 0; op < kNumOpTypes; ++op) RaiseTo(&rt.unnamed_counters[op], agreed[op]);
    RaiseTo(&rt.process_set_calls, agreed.back());
  }
  return state->result;
}

namespace {

// Enqueues an add or remove of a process set on the global set, carrying `values` for the
// agreement check, and waits for it. Returns the operation's result.
int32_t ChangeProcessSets(const char* call, OpType op, std::vector<int64_t> values) {
  RequireCallerThread(call);
  Runtime& rt = ActiveRuntime(call);
  const std::string name =
      "gradsync." + OpTypeName(op) + "." + std::to_string(rt.process_set_calls++);
  auto entry = NewEntry(rt, op, name, nullptr);
  entry->splits = std::move(values);
  std::shared_ptr<OpState> state = entry->state;
  Submit(rt, std::move(entry), Status::OK()).wait();
  return state->result;
}

}  // namespace

ProcessSet add_process_set(const std::vector<int>& ranks) {
  // Checked on the background thread once every rank is known to have passed the same list, so
  // that a bad list fails on every rank alike instead of stalling the ones that passed a good one.
  return MakeProcessSet(ChangeProcessSets("add_process_set", OpType::kAddProcessSet,
                                          std::vector<int64_t>(ranks.begin(), ranks.end())));
}

void remove_process_set(const ProcessSet& process_set) {
  ChangeProcessSets("remove_process_set", OpType::kRemoveProcessSet, {process_set.id()});
}

std::vector<ProcessSet> process_sets() {
  std::vector<ProcessSet> out;
  for (const ProcessSetInfo& info : ActiveRuntime("process_sets").registry.All()) {
    out.push_back(MakeProcessSet(info.id));
  }
  return out;
}

namespace {

ProcessSetInfo FindProcessSet(int id) {
  ProcessSetInfo info;
  if (!ActiveRuntime("ProcessSet").registry.Find(id, &info)) {
    Throw(Status::InvalidArgument("process set " + std::to_string(id) +
                                  " does not exist (never added, or removed)"));
  }
  return info;
}

}  // namespace

std::vector<int> ProcessSet::ranks() const { return FindProcessSet(id_).ranks; }
int ProcessSet::size() const { return static_cast<int>(FindProcessSet(id_).ranks.size()); }
int ProcessSet::rank() const { return FindProcessSet(id_).set_rank; }

}  // namespace gradsync
