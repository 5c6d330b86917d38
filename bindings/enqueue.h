// The enqueue steps that the collectives' files share (allreduce.cc, allgather.cc,
// reducescatter.cc, broadcast.cc, alltoall.cc, barrier.cc): argument checks, process set
// membership, producer readiness and grouped submission. NewEntry, Submit and MakeHandle, which
// other files use too, are declared in runtime.h with FillAllreduce. Internal: not installed.
//
// Thread safety: as the public header says for enqueues: any thread may call these while gradsync
// runs; the checks are pure, and the runtime's counters and queue are safe to share.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bindings/runtime.h"
#include "coordinator/wire_format.h"

namespace gradsync {

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
Status ValidateTensor(const TensorView& t, int64_t bytes, const char* what);
Status ValidateTensor(const TensorView& t, const char* what);

inline Status ValidateScale(double factor, const char* what) {
  if (std::isfinite(factor)) return Status::OK();
  return Status::InvalidArgument(std::string(what) + " factor must be finite");
}

// Records the entry's process set and returns why this rank cannot use it, if it cannot. When
// `set_size` is given it receives the set's size.
Status UseProcessSet(const Runtime& rt, const ProcessSet& set, TensorEntry* entry,
                     int* set_size = nullptr);

// A root given as a rank of the global set, as Horovod takes it also for a process set, as the
// set's own rank of it (what the data plane uses); why not when it is out of range or not a
// member of `set`.
Status RootInSet(const Runtime& rt, const ProcessSet& set, int root, int* set_root);

// Enqueues a group atomically: every member is accepted or the call throws and none is enqueued.
// The group is known by its first member's name, which is unique while in flight.
std::vector<Handle> SubmitGroup(Runtime& rt, std::vector<std::unique_ptr<TensorEntry>> entries,
                                const std::vector<Status>& validations);

// A device input's producer readiness (DeviceReadiness) as the entry's event. Host tensors ignore
// it; the cheap test comes first, since nearly every enqueue has none.
Status AttachReadiness(const DeviceReadiness& ready, TensorEntry* entry);

// Throws unless a grouped call got one name per tensor (or none) and, when it needs them, one
// allocator per tensor. `allocators` is null for calls without allocators.
void RequireGroupArguments(const char* call, size_t tensors, size_t names,
                           const size_t* allocators);

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

}  // namespace gradsync
