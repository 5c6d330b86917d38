// reducescatter() and grouped_reducescatter(): their arguments checked into reducescatter entries.
#include <string>
#include <utility>
#include <vector>

#include "bindings/enqueue.h"
#include "gradsync/gradsync.h"

namespace gradsync {

namespace {

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
  if (status.ok() && options.op == ReduceOp::kAdasum) {
    status = Status::InvalidArgument("Adasum is an allreduce op; reducescatter cannot use it");
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

}  // namespace

Handle reducescatter(const TensorView& input, Allocator allocate,
                     const ReducescatterOptions& options) {
  Runtime& rt = ActiveRuntime("reducescatter");
  auto entry = NewEntry(rt, OpType::kReducescatter, options.name, options.on_complete);
  const Status status = FillReducescatter(rt, input, std::move(allocate), options, entry.get());
  return Submit(rt, std::move(entry), status);
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

}  // namespace gradsync
