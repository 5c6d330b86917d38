// allgather() and grouped_allgather(): their arguments checked into allgather entries.
#include <string>
#include <utility>
#include <vector>

#include "bindings/enqueue.h"
#include "gradsync/gradsync.h"

namespace gradsync {

namespace {

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

}  // namespace

Handle allgather(const TensorView& input, Allocator allocate, const AllgatherOptions& options) {
  Runtime& rt = ActiveRuntime("allgather");
  auto entry = NewEntry(rt, OpType::kAllgather, options.name, options.on_complete);
  const Status status = FillAllgather(rt, input, std::move(allocate), options.process_set,
                                      options.ready, entry.get());
  return Submit(rt, std::move(entry), status);
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

}  // namespace gradsync
