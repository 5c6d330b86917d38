// alltoall(): its arguments checked into an alltoall entry.
#include <string>
#include <utility>

#include "bindings/enqueue.h"
#include "gradsync/gradsync.h"
#include "ops/data_plane.h"

namespace gradsync {

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
  // As Horovod: without splits, every rank gets the same number of rows or the call is refused,
  // rather than some ranks silently getting one row more.
  if (status.ok() && options.splits.empty() && set_size > 0 && input.shape[0] % set_size != 0) {
    status = Status::InvalidArgument(
        "alltoall without splits needs a first dimension divisible by the " +
        std::to_string(set_size) + " ranks of its process set, not " +
        std::to_string(input.shape[0]) + ": pass splits to send uneven pieces");
  }
  AssignView(input, &entry->input);
  entry->allocator = std::move(allocate);
  entry->splits = options.splits;
  if (status.ok()) status = AttachReadiness(options.ready, entry.get());
  return Submit(rt, std::move(entry), status);
}

}  // namespace gradsync
