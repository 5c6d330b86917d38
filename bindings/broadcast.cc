// broadcast(): its arguments checked into a broadcast entry.
#include <string>
#include <utility>

#include "bindings/enqueue.h"
#include "gradsync/gradsync.h"

namespace gradsync {

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

}  // namespace gradsync
