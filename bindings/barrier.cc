// barrier(): a barrier entry on a process set.
#include <string>
#include <utility>

#include "bindings/enqueue.h"
#include "gradsync/gradsync.h"

namespace gradsync {

Handle barrier(const std::string& name) { return barrier(name, ProcessSet()); }

Handle barrier(const std::string& name, const ProcessSet& process_set) {
  Runtime& rt = ActiveRuntime("barrier");
  auto entry = NewEntry(rt, OpType::kBarrier, name, nullptr);
  const Status status = UseProcessSet(rt, process_set, entry.get());
  return Submit(rt, std::move(entry), status);
}

}  // namespace gradsync
