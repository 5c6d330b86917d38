// broadcast(): its arguments checked into a broadcast entry.
#include <string>
#include <utility>

#include "bindings/enqueue.h"
#include "gradsync/gradsync.h"

namespace gradsync {

Handle broadcast(const TensorView& tensor, int root, const BroadcastOptions& options) {
  Runtime& rt = ActiveRuntime("broadcast");
  auto entry = NewEntry(rt, OpType::kBroadcast, options.name, options.on_complete);
  Status status = UseProcessSet(rt, options.process_set, entry.get());
  if (status.ok()) status = ValidateTensor(tensor, "");
  int set_root = 0;
  if (status.ok()) status = RootInSet(rt, options.process_set, root, &set_root);
  AssignView(tensor, &entry->input);
  AssignView(tensor, &entry->output);
  entry->root = set_root;
  if (status.ok()) status = AttachReadiness(options.ready, entry.get());
  return Submit(rt, std::move(entry), status);
}

}  // namespace gradsync
