// allreduce() and grouped_allreduce(): their arguments checked into allreduce entries.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "bindings/enqueue.h"
#include "gradsync/gradsync.h"
#include "ops/mpi/adasum.h"

namespace gradsync {
namespace {

// What Adasum (ops/mpi/adasum.h) combines: floating-point tensors, over a power-of-two set.
Status CheckAdasum(const TensorView& input, int set_size) {
  if (!IsFloatingPoint(input.dtype)) {
    return Status::InvalidArgument("Adasum reduces floating-point tensors, not " +
                                   DataTypeName(input.dtype));
  }
  if (!IsPowerOfTwo(set_size)) {
    return Status::InvalidArgument("Adasum needs a process set of a power-of-two size, not " +
                                   std::to_string(set_size));
  }
  return Status::OK();
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
      IsValidReduceOp(options.op) && options.op != ReduceOp::kAdasum &&
      std::isfinite(options.prescale) && std::isfinite(options.postscale)) {
    entry->process_set = 0;
    return AttachReadiness(options.ready, entry);
  }
  int set_size = 0;
  GRADSYNC_RETURN_IF_ERROR(UseProcessSet(rt, options.process_set, entry, &set_size));
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
  if (options.op == ReduceOp::kAdasum) GRADSYNC_RETURN_IF_ERROR(CheckAdasum(input, set_size));
  GRADSYNC_RETURN_IF_ERROR(ValidateScale(options.prescale, "prescale"));
  GRADSYNC_RETURN_IF_ERROR(ValidateScale(options.postscale, "postscale"));
  return AttachReadiness(options.ready, entry);
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

}  // namespace gradsync
