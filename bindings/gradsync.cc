// The public C++ API's collectives and handles: argument validation on the caller's thread, then a
// TensorEntry into the queue.
#include "gradsync/gradsync.h"

#include <cmath>
#include <memory>

#include "bindings/runtime.h"
#include "coordinator/wire_format.h"
#include "ops/data_plane.h"
#include "ops/device/device_events.h"
#include "runtime/op_state.h"

namespace gradsync {

namespace {

std::string Describe(const Runtime& rt, OpType op, const std::string& name) {
  return OpTypeName(op) + " of tensor '" + name + "' on rank " + std::to_string(rt.mpi->rank());
}

// Whether a tensor can be enqueued on this build: the one definition, which the hot path tests
// without building a Status. `bytes` is t.num_bytes() (-1 for an unknown dtype, a negative
// dimension or an overflow).
inline bool PlainlyValid(const TensorView& t, int64_t bytes) {
  return bytes >= 0 && (bytes == 0 || t.data != nullptr) &&
         (t.device.kind == DeviceKind::kCpu || t.device.kind == DeviceKind::kCuda) &&
         t.shape.size() <= kMaxWireDims;
}

// OK when PlainlyValid; otherwise why not. Messages carry no context; Submit prefixes the
// operation, tensor and rank on failure only, so the hot enqueue path builds no strings.
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

inline Status ValidateScale(double factor, const char* what) {
  if (std::isfinite(factor)) return Status::OK();
  return Status::InvalidArgument(std::string(what) + " factor must be finite");
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

// Records the entry's process set and returns why this rank cannot use it, if it cannot. When
// `set_size` is given it receives the set's size.
Status UseProcessSet(const Runtime& rt, const ProcessSet& set, TensorEntry* entry,
                     int* set_size = nullptr) {
  entry->process_set = set.id();
  int set_rank = 0;
  int size = 0;
  const Status status = Membership(rt, set, &set_rank, &size);
  if (set_size != nullptr) *set_size = size;
  return status;
}

// Throws `validation` (or a name too long for the wire) with the operation, tensor and rank in
// front.
void ThrowIfRefused(const Runtime& rt, TensorEntry* entry, const Status& checked) {
  const bool internal = entry->op == OpType::kJoin || entry->op == OpType::kAddProcessSet ||
                        entry->op == OpType::kRemoveProcessSet;
  const std::string& name = entry->name;
  const bool reserved =
      !internal && name.size() >= 9 && name[0] == 'g' && name.compare(0, 9, "gradsync.") == 0;
  if (checked.ok() && !reserved && name.size() <= kMaxWireNameBytes) return;  // accepted
  Status validation = checked;
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

// Called only for accepted operations, so every rank's counter stays in step even when one rank's
// enqueue is refused.
void NameIfUnnamed(Runtime& rt, TensorEntry* entry) {
  if (!entry->name.empty()) return;
  const auto op = static_cast<int>(entry->op);
  if (entry->process_set == 0) {
    entry->name = OpTypeName(entry->op) + ".noname." + std::to_string(rt.unnamed_counters[op]++);
    return;
  }
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(rt.unnamed_in_sets_mu);
    n = rt.unnamed_in_sets[{op, entry->process_set}]++;
  }
  entry->name = OpTypeName(entry->op) + ".set" + std::to_string(entry->process_set) + ".noname." +
                std::to_string(n);
}

// Enqueues a group atomically: every member is accepted or the call throws and none is enqueued.
// The group is known by its first member's name, which is unique while in flight.
std::vector<Handle> SubmitGroup(Runtime& rt, std::vector<std::unique_ptr<TensorEntry>> entries,
                                const std::vector<Status>& validations) {
  for (size_t i = 0; i < entries.size(); ++i) ThrowIfRefused(rt, entries[i].get(), validations[i]);
  if (entries.empty()) return {};
  for (auto& entry : entries) NameIfUnnamed(rt, entry.get());
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
  const Status pushed = rt.queue.PushAll(std::move(entries));
  if (!pushed.ok()) {
    for (const std::string& name : traced_names) rt.timeline.ActivityEnd(name);
    Throw(pushed);
  }
  return handles;
}

// A device input's producer readiness (DeviceReadiness) as the entry's event. Host tensors ignore
// it; the cheap test comes first, since nearly every enqueue has none.
Status AttachReadiness(const DeviceReadiness& ready, TensorEntry* entry) {
  if (ready.cuda_event == nullptr && ready.cuda_stream == nullptr) return Status::OK();
  if (entry->input.device.kind != DeviceKind::kCuda) return Status::OK();
  return ImportReadiness(ready.cuda_event, ready.cuda_stream, entry->input.device.index,
                         &entry->ready);
}

Status FillAllgather(const Runtime& rt, const TensorView& input, Allocator allocate,
                     const ProcessSet& process_set, const DeviceReadiness& ready,
                     TensorEntry* entry) {
  Status status = UseProcessSet(rt, process_set, entry);
  if (status.ok()) status = ValidateTensor(input, "");
  if (status.ok() && !allocate) status = Status::InvalidArgument("no output allocator");
  AssignView(input, &entry->input);
  entry->allocator = std::move(allocate);
  if (status.ok()) status = AttachReadiness(ready, entry);
  return status;
}

Status FillReducescatter(const Runtime& rt, const TensorView& input, Allocator allocate,
                         const ReducescatterOptions& options, TensorEntry* entry) {
  Status status = UseProcessSet(rt, options.process_set, entry);
  if (status.ok()) status = ValidateTensor(input, "");
  if (status.ok() && input.shape.empty()) {
    status = Status::InvalidArgument("a scalar cannot be scattered; the input needs a dimension");
  }
  if (status.ok() && !allocate) status = Status::InvalidArgument("no output allocator");
  if (status.ok() && !IsValidReduceOp(options.op)) {
    status = Status::InvalidArgument("unknown reduce op " + ReduceOpName(options.op));
  }
  if (status.ok()) status = ValidateScale(options.prescale, "prescale");
  if (status.ok()) status = ValidateScale(options.postscale, "postscale");
  AssignView(input, &entry->input);
  entry->allocator = std::move(allocate);
  entry->reduce_op = options.op;
  entry->prescale = options.prescale;
  entry->postscale = options.postscale;
  if (status.ok()) status = AttachReadiness(options.ready, entry);
  return status;
}

// Throws unless a grouped call got one name per tensor (or none) and, when it needs them, one
// allocator per tensor. `allocators` is null for calls without allocators.
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

// One entry per member of a grouped call, named from `names` (or generated when it is empty) and
// filled by `fill(i, entry)`, enqueued as one group.
template <typename Fill>
std::vector<Handle> EnqueueGroup(Runtime& rt, OpType op, const std::vector<std::string>& names,
                                 size_t count, Fill fill) {
  std::vector<std::unique_ptr<TensorEntry>> entries;
  std::vector<Status> validations;
  for (size_t i = 0; i < count; ++i) {
    entries.push_back(NewEntry(rt, op, names.empty() ? std::string() : names[i], nullptr));
    validations.push_back(fill(i, entries.back().get()));
  }
  return SubmitGroup(rt, std::move(entries), validations);
}

}  // namespace

// Fills first and validates after, returning at the first problem: the entry is discarded on
// failure anyway, and the accepted path then costs no Status assignments.
Status FillAllreduce(const Runtime& rt, const TensorView& input, const TensorView& output,
                     const AllreduceOptions& options, TensorEntry* entry) {
  AssignView(input, &entry->input);
  AssignView(output, &entry->output);
  entry->reduce_op = options.op;
  entry->prescale = options.prescale;
  entry->postscale = options.postscale;
  const bool same_view =
      &input == &output || (input.data == output.data && input.dtype == output.dtype &&
                            input.device == output.device && input.shape == output.shape);
  // The usual call, in place on the global set with valid arguments, in one test.
  const int64_t bytes = input.num_bytes();
  if (same_view && options.process_set.id() == 0 && PlainlyValid(input, bytes) &&
      IsValidReduceOp(options.op) && std::isfinite(options.prescale) &&
      std::isfinite(options.postscale)) {
    entry->process_set = 0;
    return AttachReadiness(options.ready, entry);
  }
  GRADSYNC_RETURN_IF_ERROR(UseProcessSet(rt, options.process_set, entry));
  GRADSYNC_RETURN_IF_ERROR(ValidateTensor(input, bytes, ""));
  if (!same_view) {
    GRADSYNC_RETURN_IF_ERROR(ValidateTensor(output, "output: "));
    if (output.dtype != input.dtype || output.shape != input.shape ||
        output.device != input.device) {
      return Status::InvalidArgument(
          "output (" + DataTypeName(output.dtype) + " " + ShapeString(output.shape) + " on " +
          DeviceName(output.device) + ") differs from input (" + DataTypeName(input.dtype) + " " +
          ShapeString(input.shape) + " on " + DeviceName(input.device) + ")");
    }
  }
  if (!IsValidReduceOp(options.op)) {
    return Status::InvalidArgument("unknown reduce op " + ReduceOpName(options.op));
  }
  GRADSYNC_RETURN_IF_ERROR(ValidateScale(options.prescale, "prescale"));
  GRADSYNC_RETURN_IF_ERROR(ValidateScale(options.postscale, "postscale"));
  return AttachReadiness(options.ready, entry);
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
  NameIfUnnamed(rt, entry.get());
  std::shared_ptr<OpState> state = entry->state;
  const bool traced = rt.timeline.active();
  // Started before the push: once pushed, the background thread may end it at any moment.
  if (traced) rt.timeline.ActivityStart(entry->name, "QUEUE");
  std::string refused_name;
  if (traced) refused_name = entry->name;
  const Status pushed = rt.queue.Push(std::move(entry));
  if (!pushed.ok()) {
    if (traced) rt.timeline.ActivityEnd(refused_name);
    Throw(pushed);
  }
  return MakeHandle(std::move(state));
}

Handle MakeHandle(std::shared_ptr<OpState> state) {
  Handle h;
  h.state_ = std::move(state);
  return h;
}

Handle allreduce(const TensorView& tensor, const AllreduceOptions& options) {
  return allreduce(tensor, tensor, options);
}

Handle allreduce(const TensorView& input, const TensorView& output,
                 const AllreduceOptions& options) {
  Runtime& rt = ActiveRuntime("allreduce");
  auto entry = NewEntry(rt, OpType::kAllreduce, options.name, options.on_complete);
  const Status status = FillAllreduce(rt, input, output, options, entry.get());
  return Submit(rt, std::move(entry), status);
}

Handle allgather(const TensorView& input, Allocator allocate, const AllgatherOptions& options) {
  Runtime& rt = ActiveRuntime("allgather");
  auto entry = NewEntry(rt, OpType::kAllgather, options.name, options.on_complete);
  const Status status = FillAllgather(rt, input, std::move(allocate), options.process_set,
                                      options.ready, entry.get());
  return Submit(rt, std::move(entry), status);
}

Handle reducescatter(const TensorView& input, Allocator allocate,
                     const ReducescatterOptions& options) {
  Runtime& rt = ActiveRuntime("reducescatter");
  auto entry = NewEntry(rt, OpType::kReducescatter, options.name, options.on_complete);
  const Status status = FillReducescatter(rt, input, std::move(allocate), options, entry.get());
  return Submit(rt, std::move(entry), status);
}

std::vector<Handle> grouped_allreduce(const std::vector<TensorView>& tensors,
                                      const GroupedAllreduceOptions& options) {
  Runtime& rt = ActiveRuntime("grouped_allreduce");
  RequireGroupArguments("grouped_allreduce", tensors.size(), options.names.size(), nullptr);
  AllreduceOptions member;
  member.op = options.op;
  member.prescale = options.prescale;
  member.postscale = options.postscale;
  member.process_set = options.process_set;
  member.ready = options.ready;
  return EnqueueGroup(rt, OpType::kAllreduce, options.names, tensors.size(),
                      [&](size_t i, TensorEntry* entry) {
                        return FillAllreduce(rt, tensors[i], tensors[i], member, entry);
                      });
}

std::vector<Handle> grouped_allgather(const std::vector<TensorView>& inputs,
                                      std::vector<Allocator> allocators,
                                      const GroupedAllgatherOptions& options) {
  Runtime& rt = ActiveRuntime("grouped_allgather");
  const size_t allocator_count = allocators.size();
  RequireGroupArguments("grouped_allgather", inputs.size(), options.names.size(), &allocator_count);
  return EnqueueGroup(rt, OpType::kAllgather, options.names, inputs.size(),
                      [&](size_t i, TensorEntry* entry) {
                        return FillAllgather(rt, inputs[i], std::move(allocators[i]),
                                             options.process_set, options.ready, entry);
                      });
}

std::vector<Handle> grouped_reducescatter(const std::vector<TensorView>& inputs,
                                          std::vector<Allocator> allocators,
                                          const GroupedReducescatterOptions& options) {
  Runtime& rt = ActiveRuntime("grouped_reducescatter");
  const size_t allocator_count = allocators.size();
  RequireGroupArguments("grouped_reducescatter", inputs.size(), options.names.size(),
                        &allocator_count);
  ReducescatterOptions member;
  member.op = options.op;
  member.prescale = options.prescale;
  member.postscale = options.postscale;
  member.process_set = options.process_set;
  member.ready = options.ready;
  return EnqueueGroup(
      rt, OpType::kReducescatter, options.names, inputs.size(), [&](size_t i, TensorEntry* entry) {
        return FillReducescatter(rt, inputs[i], std::move(allocators[i]), member, entry);
      });
}

Handle broadcast(const TensorView& tensor, int root, const BroadcastOptions& options) {
  Runtime& rt = ActiveRuntime("broadcast");
  auto entry = NewEntry(rt, OpType::kBroadcast, options.name, options.on_complete);
  int set_size = 0;
  Status status = UseProcessSet(rt, options.process_set, entry.get(), &set_size);
  if (status.ok()) status = ValidateTensor(tensor, "");
  if (status.ok() && (root < 0 || root >= set_size)) {
    status = Status::InvalidArgument(
        "root rank " + std::to_string(root) + " is outside [0, " + std::to_string(set_size) + ")" +
        (options.process_set.id() == 0 ? std::string()
                                       : " (roots are ranks within the process set)"));
  }
  AssignView(tensor, &entry->input);
  AssignView(tensor, &entry->output);
  entry->root = root;
  if (status.ok()) status = AttachReadiness(options.ready, entry.get());
  return Submit(rt, std::move(entry), status);
}

Handle alltoall(const TensorView& input, Allocator allocate, const AlltoallOptions& options) {
  Runtime& rt = ActiveRuntime("alltoall");
  auto entry = NewEntry(rt, OpType::kAlltoall, options.name, options.on_complete);
  int set_size = 0;
  Status status = UseProcessSet(rt, options.process_set, entry.get(), &set_size);
  if (status.ok()) status = ValidateTensor(input, "");
  if (status.ok() && input.shape.empty()) {
    status = Status::InvalidArgument("a scalar cannot be split; the input needs a dimension");
  }
  if (status.ok() && !allocate) status = Status::InvalidArgument("no output allocator");
  if (status.ok() && !options.splits.empty()) {
    status = CheckSplits(options.splits, input.shape[0], set_size);
  }
  AssignView(input, &entry->input);
  entry->allocator = std::move(allocate);
  entry->splits = options.splits;
  if (status.ok()) status = AttachReadiness(options.ready, entry.get());
  return Submit(rt, std::move(entry), status);
}

Handle barrier(const std::string& name) { return barrier(name, ProcessSet()); }

Handle barrier(const std::string& name, const ProcessSet& process_set) {
  Runtime& rt = ActiveRuntime("barrier");
  auto entry = NewEntry(rt, OpType::kBarrier, name, nullptr);
  const Status status = UseProcessSet(rt, process_set, entry.get());
  return Submit(rt, std::move(entry), status);
}

void Handle::wait() const {
  RequireCallerThread("Handle::wait");
  if (!state_) Throw(Status::InvalidArgument("wait() on an empty handle"));
  EndPauseBeforeBlocking(*state_);
  const Status& status = state_->Wait();  // no copy: every handle of a step is waited on
  if (!status.ok()) Throw(status);
}

bool Handle::wait_for(std::chrono::nanoseconds timeout) const {
  RequireCallerThread("Handle::wait_for");
  if (!state_) Throw(Status::InvalidArgument("wait_for() on an empty handle"));
  EndPauseBeforeBlocking(*state_);
  Status status;
  if (!state_->WaitFor(timeout, &status)) return false;
  if (!status.ok()) Throw(status);
  return true;
}

bool Handle::poll() const { return state_ && state_->done(); }

Status Handle::status() const { return state_ ? state_->status() : Status::OK(); }

std::vector<int64_t> Handle::output_shape() const {
  if (!state_ || !state_->done()) return {};
  return state_->output_shape;
}

void Handle::synchronize_stream(void* cuda_stream) const {
  RequireCallerThread("Handle::synchronize_stream");
  if (!state_) Throw(Status::InvalidArgument("synchronize_stream() on an empty handle"));
  bool timed_out = false;
  const std::shared_ptr<StreamEvent> launched = state_->WaitLaunched(kWaitForever, &timed_out);
  if (launched == nullptr) {
    // Ran on the host, or failed before launch: its completion is the handle's.
    wait();
    return;
  }
  const Status ordered = OrderStreamAfter(launched, cuda_stream);
  if (!ordered.ok()) Throw(ordered);
}

std::vector<int64_t> Handle::received_splits() const {
  if (!state_ || !state_->done()) return {};
  return state_->received_splits;
}

}  // namespace gradsync
