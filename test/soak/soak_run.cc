// One soak step on this rank; see soak_run.h.
#include "test/soak/soak_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <sstream>
#include <thread>

#include "ops/device/bucket_layout.h"

namespace gradsync {
namespace soak {
namespace {

Allocator Into(std::unique_ptr<Buffer>* slot) {
  return [slot](const std::vector<int64_t>& shape, DataType dtype) -> void* {
    *slot = std::make_unique<Buffer>(dtype, shape);
    return (*slot)->data();
  };
}

}  // namespace

void Failures::Add(const std::string& what) {
  // Stall messages list every waiting tensor; the start says enough.
  constexpr size_t kLongest = 600;
  if (count_++ >= print_limit_) return;
  std::fprintf(stderr, "soak rank %d: FAIL %s%s\n", rank_, what.substr(0, kLongest).c_str(),
               what.size() > kLongest ? " [...]" : "");
}

StepRunner::StepRunner(const Planner& planner, std::vector<ProcessSet> sets, uint64_t seed,
                       std::chrono::milliseconds wait_limit, bool device_tensors)
    : planner_(planner),
      sets_(std::move(sets)),
      seed_(seed),
      wait_limit_(wait_limit),
      device_tensors_(device_tensors),
      rank_(gradsync::rank()),
      size_(gradsync::size()) {}

StepRunner::~StepRunner() = default;

std::string StepRunner::Describe(const Live& live, size_t tensor) const {
  const OpPlan& op = *live.plan;
  std::ostringstream out;
  out << "step " << step_ << ": " << (op.grouped ? "grouped " : "") << KindName(op.kind);
  if (tensor < op.tensors.size()) {
    const std::string& name = op.tensors[tensor].name;
    out << (name.empty() ? " of a tensor with a generated name"
                         : " of '" + name.substr(0, 80) + "'")
        << " (" << DataTypeName(op.tensors[tensor].dtype);
  }
  if (op.kind == Kind::kAllreduce || op.kind == Kind::kReducescatter) {
    out << ", " << ReduceOpName(op.op) << ", prescale " << op.prescale << ", postscale "
        << op.postscale;
  }
  out << ", set of ranks";
  for (int r : *live.members) out << ' ' << r;
  out << ")";
  return out.str();
}

TensorView StepRunner::View(Buffer* buffer) const {
  TensorView view = buffer->view();
  if (device_tensors_) view.device = Device::Cuda(0);
  return view;
}

void StepRunner::ProduceLater(Live* live, Buffer* input) {
  // The values move to a copy, the input holds a pattern no result can come from, and the
  // producer writes the values back a little later: a collective that read the input before the
  // producer's event would reduce or move the pattern.
  auto values = std::make_unique<Buffer>(input->dtype(), input->shape());
  const size_t bytes = static_cast<size_t>(input->bytes());
  if (bytes > 0) {
    std::memcpy(values->data(), input->data(), bytes);
    std::memset(input->data(), 0xA5, bytes);
  }
  const auto delay =
      std::chrono::microseconds(Mix(seed_, reinterpret_cast<uintptr_t>(input)) % 200);
  void* to = input->data();
  const void* from = values->data();
  producer_.Enqueue([to, from, bytes, delay] {
    std::this_thread::sleep_for(delay);
    if (bytes > 0) std::memcpy(to, from, bytes);
  });
  live->produced.push_back(std::move(values));
}

int StepRunner::Run(const StepPlan& plan, Tally* tally, Failures* failures) {
  step_ = plan.step;
  ++tally->steps;
  if (plan.steady) ++tally->steady_steps;
  if (plan.after_stretch) ++tally->deviations[static_cast<int>(plan.deviation)];
  if (plan.join) {
    ++tally->joins;
    const int mine = plan.join_rounds[static_cast<size_t>(rank_)];
    for (int round = 0; round < mine; ++round) {
      std::vector<int> running;
      for (int r = 0; r < size_; ++r) {
        if (plan.join_rounds[static_cast<size_t>(r)] > round) running.push_back(r);
      }
      // An average still divides by every rank, joined ones included.
      if (!RunOps(plan, plan.join_ops[static_cast<size_t>(round)], nullptr, &running, size_, tally,
                  failures)) {
        return -1;
      }
    }
    int last = -1;
    try {
      last = join();
    } catch (const Error& e) {
      failures->Add("step " + std::to_string(step_) + ": join() threw " + e.what());
      return -1;
    }
    const int most = *std::max_element(plan.join_rounds.begin(), plan.join_rounds.end());
    if (last < 0 || last >= size_ || plan.join_rounds[static_cast<size_t>(last)] != most) {
      failures->Add("step " + std::to_string(step_) + ": join() returned " + std::to_string(last) +
                    ", which is not one of the ranks with the most rounds (" +
                    std::to_string(most) + ")");
    }
    return last;
  }
  if (plan.added_set.empty()) {
    RunOps(plan, plan.ops, nullptr, nullptr, 0, tally, failures);
    return -1;
  }
  ProcessSet added;
  try {
    added = add_process_set(plan.added_set);
  } catch (const Error& e) {
    failures->Add("step " + std::to_string(step_) + ": add_process_set threw " + e.what());
    return -1;
  }
  ++tally->added_sets;
  RunOps(plan, plan.ops, &added, nullptr, 0, tally, failures);
  try {
    remove_process_set(added);
  } catch (const Error& e) {
    failures->Add("step " + std::to_string(step_) + ": remove_process_set threw " + e.what());
  }
  return -1;
}

bool StepRunner::RunOps(const StepPlan& plan, const std::vector<OpPlan>& ops,
                        const ProcessSet* added, const std::vector<int>* contributors, int divisor,
                        Tally* tally, Failures* failures) {
  std::vector<std::unique_ptr<Live>> lives;
  const auto& sets = planner_.sets();
  for (const OpPlan& op : ops) {
    auto live = std::make_unique<Live>();
    live->plan = &op;
    live->members = op.set < static_cast<int>(sets.size()) ? &sets[static_cast<size_t>(op.set)]
                                                           : &plan.added_set;
    const auto at = std::find(live->members->begin(), live->members->end(), rank_);
    if (at == live->members->end()) continue;  // not a member: the others run it without us
    live->me = static_cast<int>(at - live->members->begin());
    lives.push_back(std::move(live));
  }
  // Every rank submits in its own order; negotiation has to line them up. Now and then a rank
  // submits from two threads at once, and waits by polling instead of wait_for.
  Rng local(Mix(Mix(seed_, static_cast<uint64_t>(step_)), 0xABC0 + static_cast<uint64_t>(rank_)));
  std::vector<Live*> named, unnamed;
  for (auto& live : lives) {
    live->choice = local.Next();
    (live->plan->unnamed ? unnamed : named).push_back(live.get());
  }
  local.Shuffle(&named);
  const bool two_threads = local.Chance(0.25);
  const bool poll = local.Chance(0.3);
  if (plan.late_rank == rank_ && !named.empty()) {
    // Locked, the bucket that needs the last tensor waits for it on every rank; past
    // GRADSYNC_LOCK_WAIT_MS the set leaves the lock, and negotiation runs what is left.
    for (size_t i = 0; i + 1 < named.size(); ++i) TryEnqueue(named[i], added);
    std::this_thread::sleep_for(std::chrono::milliseconds(plan.late_ms));
    TryEnqueue(named.back(), added);
  } else if (two_threads) {
    std::thread helper([&] {
      for (size_t i = 1; i < named.size(); i += 2) TryEnqueue(named[i], added);
    });
    for (size_t i = 0; i < named.size(); i += 2) TryEnqueue(named[i], added);
    helper.join();
  } else {
    for (Live* live : named) TryEnqueue(live, added);
  }
  for (Live* live : unnamed) TryEnqueue(live, added);  // one thread, the same order everywhere
  const auto deadline = std::chrono::steady_clock::now() + wait_limit_;
  bool all_done = true;
  for (auto& live : lives) {
    if (!live->enqueue_error.empty()) {
      failures->Add(Describe(*live, 0) + ": enqueue threw " + live->enqueue_error);
    }
    if (!Wait(live.get(), deadline, poll, failures)) all_done = false;
    const bool done =
        live->enqueued && std::all_of(live->handles.begin(), live->handles.end(),
                                      [](const Handle& h) { return h.poll() && h.status().ok(); });
    if (!done) continue;
    const std::vector<int>& from = contributors ? *contributors : *live->members;
    Check(live.get(), from, divisor ? divisor : static_cast<int>(live->members->size()), failures);
    tally->ops += static_cast<int64_t>(live->handles.size());
    tally->callbacks += live->callbacks.load();
    for (const auto& b : live->inputs) tally->bytes += b ? b->bytes() : 0;
    for (const auto& b : live->outputs) tally->bytes += b ? b->bytes() : 0;
  }
  if (!all_done) {
    for (auto& live : lives) abandoned_.push_back(std::move(live));
  }
  // The producer's writes that no completed operation waited for (an operation that failed
  // first) land before their buffers go.
  if (device_tensors_) producer_.Record()->Wait(kWaitForever);
  lives.clear();
  // Abandoned buffers may still be written by gradsync, so their arena is never recycled.
  if (abandoned_.empty()) StepArena::Get().Reset();
  return all_done;
}

void StepRunner::TryEnqueue(Live* live, const ProcessSet* added) {
  const int set = live->plan->set;
  try {
    Enqueue(live, set < static_cast<int>(sets_.size()) ? sets_[static_cast<size_t>(set)] : *added,
            live->choice);
    live->enqueued = true;
  } catch (const Error& e) {
    live->enqueue_error = e.what();
  }
}

bool StepRunner::Wait(Live* live, std::chrono::steady_clock::time_point deadline, bool poll,
                      Failures* failures) {
  bool in_time = true;
  for (size_t t = 0; t < live->handles.size(); ++t) {
    const Handle& h = live->handles[t];
    try {
      if (poll) {
        while (!h.poll() && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        if (h.poll() && !h.status().ok()) throw Error(h.status());
      } else {
        h.wait_for(std::max(deadline - std::chrono::steady_clock::now(),
                            std::chrono::steady_clock::duration::zero()));
      }
      if (!h.poll()) {
        failures->Add(Describe(*live, t) + ": HANG, not complete " +
                      std::to_string(wait_limit_.count()) + " ms after the step's enqueues");
        in_time = false;
      }
    } catch (const Error& e) {
      failures->Add(Describe(*live, t) + ": failed: " + e.what());
    }
  }
  return in_time;
}

void StepRunner::Enqueue(Live* live, const ProcessSet& set, uint64_t local_choice) {
  const OpPlan& op = *live->plan;
  const int me = live->me;
  const int n = static_cast<int>(live->members->size());
  const size_t count = op.tensors.size();
  // Local choices that other ranks cannot see: out-of-place outputs and callbacks.
  live->out_of_place = op.kind == Kind::kAllreduce && !op.grouped && local_choice % 3 == 0;
  live->callback = !op.grouped && op.kind != Kind::kBarrier && (local_choice >> 8) % 2 == 0;
  const bool produced_later = device_tensors_ && (local_choice >> 24) % 2 == 0;
  // A grouped allreduce's inputs back to back in one block, each on a 16-byte boundary, as a flat
  // gradient buffer holds them: a device bucket of them is reduced where it lies on this rank
  // while other ranks copy theirs (ops/device/bucket_layout.h).
  std::vector<size_t> flat_offsets;
  if (op.kind == Kind::kAllreduce && op.grouped && (local_choice >> 28) % 2 == 0) {
    size_t end = 0;
    for (const TensorPlan& tp : op.tensors) {
      const size_t bytes = static_cast<size_t>(Elements(tp.shape)) * DataTypeSize(tp.dtype);
      flat_offsets.push_back(bytes == 0 ? end : AlignBucketSegment(end));
      end = flat_offsets.back() + bytes;
    }
    live->flat =
        std::make_unique<Buffer>(DataType::kUInt8, std::vector<int64_t>{static_cast<int64_t>(end)});
  }
  live->outputs.resize(count);
  std::vector<TensorView> views;
  std::vector<Allocator> allocators;
  std::vector<std::string> names;
  for (size_t t = 0; t < count; ++t) {
    const TensorPlan& tp = op.tensors[t];
    names.push_back(tp.name);
    if (op.kind == Kind::kBarrier) continue;
    std::vector<int64_t> shape = tp.shape;
    if (op.kind == Kind::kAllgather || op.kind == Kind::kAlltoall) {
      shape =
          tp.scalar ? std::vector<int64_t>{} : WithRows(tp.rows[static_cast<size_t>(me)], tp.shape);
    }
    auto in = flat_offsets.empty()
                  ? std::make_unique<Buffer>(tp.dtype, shape)
                  : std::make_unique<Buffer>(
                        tp.dtype, shape,
                        static_cast<unsigned char*>(live->flat->data()) + flat_offsets[t]);
    const int64_t elements = in->elements();
    switch (op.kind) {
      case Kind::kAllreduce:
      case Kind::kReducescatter:
        for (int64_t i = 0; i < elements; ++i) {
          in->Set(i, ReduceInput(op.op, tp.dtype, tp.salt, rank_, i));
        }
        break;
      case Kind::kAllgather:
        for (int64_t i = 0; i < elements; ++i) in->Set(i, MovedValue(tp.salt, rank_, i));
        break;
      case Kind::kBroadcast:
        // Non-roots start from values outside MovedValue's range, so a missed copy shows.
        for (int64_t i = 0; i < elements; ++i) {
          in->Set(i, me == op.root ? MovedValue(tp.salt, rank_, i) : 101 + i % 20);
        }
        break;
      case Kind::kAlltoall: {
        const std::vector<int64_t>& splits = tp.splits[static_cast<size_t>(me)];
        const int64_t width = Elements(tp.shape);
        int64_t at = 0;
        for (int d = 0; d < n; ++d) {
          for (int64_t j = 0; j < splits[static_cast<size_t>(d)] * width; ++j) {
            in->Set(at++, MovedValue(tp.salt, rank_ * 64 + d, j));
          }
        }
        break;
      }
      case Kind::kBarrier:
        break;
    }
    if (produced_later) ProduceLater(live, in.get());
    views.push_back(View(in.get()));
    allocators.push_back(Into(&live->outputs[t]));
    live->inputs.push_back(std::move(in));
  }
  DeviceReadiness ready;
  if (produced_later) ready.cuda_stream = &producer_;
  CompletionCallback callback;
  if (live->callback) {
    callback = [live](const Status& s) {
      live->callbacks.fetch_add(1);
      if (!s.ok()) live->failed_callbacks.fetch_add(1);
    };
  }
  switch (op.kind) {
    case Kind::kAllreduce: {
      if (op.grouped) {
        GroupedAllreduceOptions o;
        o.names = names;
        o.op = op.op;
        o.prescale = op.prescale;
        o.postscale = op.postscale;
        o.process_set = set;
        o.ready = ready;
        live->handles = grouped_allreduce(views, o);
        break;
      }
      AllreduceOptions o;
      o.name = names[0];
      o.op = op.op;
      o.prescale = op.prescale;
      o.postscale = op.postscale;
      o.on_complete = callback;
      o.process_set = set;
      o.ready = ready;
      if (live->out_of_place) {
        live->outputs[0] = std::make_unique<Buffer>(op.tensors[0].dtype, live->inputs[0]->shape());
        live->handles = {allreduce(views[0], View(live->outputs[0].get()), o)};
      } else {
        // Half of the in-place ones pass the same view as input and output.
        live->handles = {(local_choice >> 16) % 2 ? allreduce(views[0], views[0], o)
                                                  : allreduce(views[0], o)};
      }
      break;
    }
    case Kind::kAllgather: {
      if (op.grouped) {
        GroupedAllgatherOptions o;
        o.names = names;
        o.process_set = set;
        o.ready = ready;
        live->handles = grouped_allgather(views, allocators, o);
        break;
      }
      AllgatherOptions o;
      o.name = names[0];
      o.on_complete = callback;
      o.process_set = set;
      o.ready = ready;
      live->handles = {allgather(views[0], allocators[0], o)};
      break;
    }
    case Kind::kBroadcast: {
      BroadcastOptions o;
      o.name = names[0];
      o.on_complete = callback;
      o.process_set = set;
      o.ready = ready;
      // The plan's root is a rank within the set; the call takes its global rank.
      live->handles = {broadcast(views[0], set.ranks()[static_cast<size_t>(op.root)], o)};
      break;
    }
    case Kind::kReducescatter: {
      if (op.grouped) {
        GroupedReducescatterOptions o;
        o.names = names;
        o.op = op.op;
        o.prescale = op.prescale;
        o.postscale = op.postscale;
        o.process_set = set;
        o.ready = ready;
        live->handles = grouped_reducescatter(views, allocators, o);
        break;
      }
      ReducescatterOptions o;
      o.name = names[0];
      o.op = op.op;
      o.prescale = op.prescale;
      o.postscale = op.postscale;
      o.on_complete = callback;
      o.process_set = set;
      o.ready = ready;
      live->handles = {reducescatter(views[0], allocators[0], o)};
      break;
    }
    case Kind::kAlltoall: {
      AlltoallOptions o;
      o.name = names[0];
      if (!op.even_splits) o.splits = op.tensors[0].splits[static_cast<size_t>(me)];
      o.on_complete = callback;
      o.process_set = set;
      o.ready = ready;
      live->handles = {alltoall(views[0], allocators[0], o)};
      break;
    }
    case Kind::kBarrier:
      live->handles = {barrier(names[0], set)};
      break;
  }
}

}  // namespace soak
}  // namespace gradsync
