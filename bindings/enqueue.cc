// The enqueue path every collective takes: argument checks, process set membership, naming, and
// the push of one entry or a group into the queue.
#include "bindings/enqueue.h"

#include <algorithm>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ops/device/device_events.h"
#include "ops/device/producer_readiness.h"
#include "runtime/generated_name.h"
#include "runtime/op_state.h"
#include "runtime/thread_role.h"

namespace gradsync {

namespace {

std::string Describe(const Runtime& rt, OpType op, const std::string& name) {
  return OpTypeName(op) + " of tensor '" + name + "' on rank " + std::to_string(rt.mpi->rank());
}

// This rank's rank in `set` and the set's size; the global set costs no lock.
Status Membership(const Runtime& rt, const ProcessSet& set, int* set_rank, int* set_size) {
  if (set.id() == 0) {
    *set_rank = rt.mpi->rank();
    *set_size = rt.mpi->size();
    return Status::OK();
  }
  return rt.registry.Membership(set.id(), set_rank, set_size);
}

// Runtime::cuda_device: the first CUDA operation names the process's device; later ones on
// another are refused. Once it is named, a plain load settles every enqueue.
Status CheckOneCudaDevice(const Runtime& rt, const Device& device) {
  if (device.kind != DeviceKind::kCuda) return Status::OK();
  int expected = rt.cuda_device.load(std::memory_order_relaxed);
  if (expected == device.index) return Status::OK();
  if (expected == -1 && (rt.cuda_device.compare_exchange_strong(expected, device.index) ||
                         expected == device.index)) {
    return Status::OK();
  }
  return Status::InvalidArgument(
      "a tensor on cuda:" + std::to_string(device.index) +
      ", but this process's device operations run on cuda:" + std::to_string(expected) +
      " (its first one's device); one GPU a process is supported");
}

// Throws `validation` (or a name too long for the wire) with the operation, tensor and rank in
// front.
void ThrowIfRefused(const Runtime& rt, TensorEntry* entry, const Status& checked) {
  const bool internal = entry->op == OpType::kJoin || entry->op == OpType::kAddProcessSet ||
                        entry->op == OpType::kRemoveProcessSet;
  const std::string& name = entry->name;
  const bool reserved =
      !internal && name.size() >= 9 && name[0] == 'g' && name.compare(0, 9, "gradsync.") == 0;
  // The device last: an operation refused for another reason must not fix the process's GPU.
  const bool valid = checked.ok() && !reserved && name.size() <= kMaxWireNameBytes;
  Status validation = valid ? CheckOneCudaDevice(rt, entry->input.device) : checked;
  if (valid && validation.ok()) return;  // accepted
  if (validation.ok() && reserved) {
    validation = Status::InvalidArgument("names starting with 'gradsync.' are reserved");
  }
  if (validation.ok() && entry->name.size() > kMaxWireNameBytes) {
    validation = Status::InvalidArgument("tensor name of " + std::to_string(entry->name.size()) +
                                         " bytes; at most " + std::to_string(kMaxWireNameBytes) +
                                         " are supported");
    entry->name = entry->name.substr(0, 64) + "...";
  }
  if (!validation.ok()) {
    const std::string name = entry->name.empty() ? "<unnamed>" : entry->name;
    Throw(Status(validation.code(), Describe(rt, entry->op, name) + ": " + validation.message()));
  }
}

// A producer's readiness that could not be recorded: the operation is refused, as it was before
// the queue saw it.
void ThrowIfUnrecorded(const Runtime& rt, const TensorEntry* entry, const Status& recorded) {
  if (recorded.ok()) return;
  const std::string name = entry->name.empty() ? "<unnamed>" : entry->name;
  Throw(Status(recorded.code(), Describe(rt, entry->op, name) +
                                    ": recording the producer's readiness: " + recorded.message()));
}

// Who launches a push of tensors, all of them on a device (`on_device`) or not, and when their
// producers' readiness is recorded.
struct PushRoute {
  // A device push that completes a locked bucket launches it on the caller's thread (the launch
  // is asynchronous); a host tensor's bucket runs on the background thread, which does not block
  // the caller for the reduction; and gradsync's own threads (a callback that enqueues) launch
  // nothing, since a cycle there could wait for the completions that thread is running.
  bool may_launch = false;
  // Locked, the launch of a bucket (by the push that fills it, or by the loop's thread) records
  // one event for each producer stream of its tensors; otherwise a tensor waits for negotiation,
  // and its event must mark the producer's work at its enqueue.
  bool deferrable = false;
};

PushRoute RouteOf(const Runtime& rt, bool on_device) {
  const bool callers_device_push = on_device && !OnBackgroundThread();
  return {callers_device_push && rt.loop->RunsCallerCycles(),
          callers_device_push && rt.loop->DefersReadiness()};
}

// Called only for accepted operations, so every rank's counter stays in step even when one rank's
// enqueue is refused.
void NameIfUnnamed(Runtime& rt, TensorEntry* entry) {
  if (!entry->name.empty()) return;
  const auto op = static_cast<int>(entry->op);
  uint64_t n = 0;
  if (entry->process_set == 0) {
    n = rt.unnamed_counters[op]++;
  } else {
    std::lock_guard<std::mutex> lock(rt.unnamed_in_sets_mu);
    n = rt.unnamed_in_sets[{op, entry->process_set}]++;
  }
  entry->name = GeneratedName(OpTypeName(entry->op), entry->process_set, n);
}

}  // namespace

Status ValidateTensor(const TensorView& t, int64_t bytes, const char* what) {
  if (PlainlyValid(t, bytes)) return Status::OK();
  if (!IsValidDataType(t.dtype)) {
    return Status::InvalidArgument(std::string(what) + "unknown dtype " + DataTypeName(t.dtype));
  }
  if (t.shape.size() > kMaxWireDims) {
    return Status::InvalidArgument(std::string(what) + std::to_string(t.shape.size()) +
                                   " dimensions; at most " + std::to_string(kMaxWireDims) +
                                   " are supported");
  }
  if (bytes < 0) {
    for (int64_t d : t.shape) {
      if (d < 0) {
        return Status::InvalidArgument(std::string(what) + "negative dimension in shape " +
                                       ShapeString(t.shape));
      }
    }
    return Status::InvalidArgument(std::string(what) + "shape " + ShapeString(t.shape) +
                                   " overflows a 64-bit byte count (zero dimensions aside)");
  }
  if (t.device.kind != DeviceKind::kCpu && t.device.kind != DeviceKind::kCuda) {
    return Status::InvalidArgument(std::string(what) + "unknown device kind " +
                                   std::to_string(static_cast<int>(t.device.kind)));
  }
  if (t.data == nullptr && bytes > 0) {
    return Status::InvalidArgument(std::string(what) + "data is null but the tensor has " +
                                   std::to_string(t.num_elements()) + " elements");
  }
  return Status::OK();  // not reached: PlainlyValid holds when every check above passes
}

Status ValidateTensor(const TensorView& t, const char* what) {
  return ValidateTensor(t, t.num_bytes(), what);
}

Status UseProcessSet(const Runtime& rt, const ProcessSet& set, TensorEntry* entry, int* set_size) {
  entry->process_set = set.id();
  int set_rank = 0;
  int size = 0;
  const Status status = Membership(rt, set, &set_rank, &size);
  if (set_size != nullptr) *set_size = size;
  return status;
}

Status RootInSet(const Runtime& rt, const ProcessSet& set, int root, int* set_root) {
  const int world = rt.mpi->size();
  if (root < 0 || root >= world) {
    return Status::InvalidArgument("root rank " + std::to_string(root) + " is outside [0, " +
                                   std::to_string(world) + ")");
  }
  if (set.id() == 0) {
    *set_root = root;
    return Status::OK();
  }
  ProcessSetInfo info;
  if (!rt.registry.Find(set.id(), &info)) {
    return Status::InvalidArgument("process set " + std::to_string(set.id()) + " does not exist");
  }
  const auto at = std::find(info.ranks.begin(), info.ranks.end(), root);
  if (at == info.ranks.end()) {
    std::string members;
    for (int r : info.ranks) members += (members.empty() ? "" : ", ") + std::to_string(r);
    return Status::InvalidArgument("root rank " + std::to_string(root) +
                                   " is not a member of process set " + std::to_string(set.id()) +
                                   " (ranks " + members + "; roots are global ranks)");
  }
  *set_root = static_cast<int>(at - info.ranks.begin());
  return Status::OK();
}

std::vector<Handle> SubmitGroup(Runtime& rt, std::vector<std::unique_ptr<TensorEntry>> entries,
                                const std::vector<Status>& validations) {
  for (size_t i = 0; i < entries.size(); ++i) ThrowIfRefused(rt, entries[i].get(), validations[i]);
  if (entries.empty()) return {};
  bool on_device = true;
  for (auto& entry : entries) {
    entry->state->on_device = entry->input.device.kind != DeviceKind::kCpu;
    on_device &= entry->state->on_device;
  }
  const PushRoute route = RouteOf(rt, on_device);
  // Pushed together, so one event per producer stream serves the whole group.
  std::vector<TensorEntry*> unrecorded;
  for (auto& entry : entries) {
    if (entry->ready_stream != nullptr && RecordAtEnqueue(entry->ready_stream, route.deferrable)) {
      unrecorded.push_back(entry.get());
    }
  }
  if (!unrecorded.empty()) {
    ThrowIfUnrecorded(rt, unrecorded.front(), RecordProducerReadiness(unrecorded));
  }
  const uint64_t waits = rt.caller_waits.load(std::memory_order_relaxed);
  for (auto& entry : entries) {
    NameIfUnnamed(rt, entry.get());
    entry->waits_before = waits;
  }
  std::vector<Handle> handles;
  handles.reserve(entries.size());
  for (auto& entry : entries) {
    entry->group = entries.front()->name;
    entry->group_size = static_cast<int>(entries.size());
    handles.push_back(MakeHandle(entry->state));
  }
  const bool traced = rt.timeline.active();
  std::vector<std::string> traced_names;
  if (traced) {
    for (const auto& entry : entries) {
      traced_names.push_back(entry->name);
      rt.timeline.ActivityStart(entry->name, "QUEUE");
    }
  }
  bool due = false;
  const Status pushed = rt.queue.PushAll(std::move(entries), route.may_launch ? &due : nullptr);
  if (!pushed.ok()) {
    for (const std::string& name : traced_names) rt.timeline.ActivityEnd(name);
    Throw(pushed);
  }
  if (due) rt.loop->RunCycleForCaller();
  return handles;
}

Status AttachReadiness(const DeviceReadiness& ready, TensorEntry* entry) {
  if (ready.cuda_event == nullptr && ready.cuda_stream == nullptr) return Status::OK();
  if (entry->input.device.kind != DeviceKind::kCuda) return Status::OK();
  if (ready.cuda_event == nullptr) {
    entry->ready_stream = ready.cuda_stream;  // recorded by the submit, or by a locked cycle
    return Status::OK();
  }
  return ImportReadiness(ready.cuda_event, nullptr, entry->input.device.index, &entry->ready);
}

void RequireGroupArguments(const char* call, size_t tensors, size_t names,
                           const size_t* allocators) {
  Status status;
  if (names != 0 && names != tensors) {
    status = Status::InvalidArgument(std::to_string(names) + " names for " +
                                     std::to_string(tensors) + " tensors; give one each or none");
  } else if (allocators != nullptr && *allocators != tensors) {
    status = Status::InvalidArgument(std::to_string(*allocators) + " allocators for " +
                                     std::to_string(tensors) + " tensors; give one each");
  }
  if (!status.ok()) Throw(Status(status.code(), std::string(call) + ": " + status.message()));
}

std::unique_ptr<TensorEntry> NewEntry(Runtime& rt, OpType op, const std::string& name,
                                      CompletionCallback on_complete) {
  std::unique_ptr<TensorEntry> entry = rt.queue.NewEntry();
  entry->op = op;
  entry->name = name;
  OpState::Renew(&entry->state, std::move(on_complete));
  return entry;
}

Handle Submit(Runtime& rt, std::unique_ptr<TensorEntry> entry, const Status& validation) {
  ThrowIfRefused(rt, entry.get(), validation);
  std::shared_ptr<OpState> state = entry->state;
  state->on_device = entry->input.device.kind != DeviceKind::kCpu;
  const PushRoute route = RouteOf(rt, state->on_device);
  // Before naming, as for any refusal.
  if (entry->ready_stream != nullptr && RecordAtEnqueue(entry->ready_stream, route.deferrable)) {
    TensorEntry* unrecorded = entry.get();
    ThrowIfUnrecorded(rt, entry.get(), RecordProducerReadiness(&unrecorded, 1));
  }
  NameIfUnnamed(rt, entry.get());
  entry->waits_before = rt.caller_waits.load(std::memory_order_relaxed);
  const bool traced = rt.timeline.active();
  // Started before the push: once pushed, the background thread may end it at any moment.
  if (traced) rt.timeline.ActivityStart(entry->name, "QUEUE");
  std::string refused_name;
  if (traced) refused_name = entry->name;
  bool due = false;
  const Status pushed = rt.queue.Push(std::move(entry), route.may_launch ? &due : nullptr);
  if (!pushed.ok()) {
    if (traced) rt.timeline.ActivityEnd(refused_name);
    Throw(pushed);
  }
  if (due) rt.loop->RunCycleForCaller();
  return MakeHandle(std::move(state));
}

Handle MakeHandle(std::shared_ptr<OpState> state) {
  Handle h;
  h.state_ = std::move(state);
  return h;
}

}  // namespace gradsync
