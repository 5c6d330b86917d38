// gradsync._core's table of Horovod's integer handles: what gradsync.torch's asynchronous
// collectives return and poll() and synchronize() take. Each entry holds the runtime's handles of
// one call, the Python objects its operation reads or writes (kept alive until it is
// synchronized) and what synchronize() returns: a result object, or what a finish callable makes.
//
// The table lives here rather than in Python so that a step's thousand allreduce_async_ and
// synchronize calls cost one call into the module each: the Python-side bookkeeping (an object
// per handle, a closure, a dict) had cost more than the runtime's own enqueue.
//
// Threads: every member is called with the GIL held, which guards the table. synchronize() takes
// its entry out before it releases the GIL to block, so no other thread sees it half-waited.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core_module.h"

namespace gradsync {
namespace python {
namespace {

struct PendingCall {
  std::vector<Handle> handles;
  py::object keep;      // what the operation reads or writes
  py::object result;    // returned by synchronize() when there is no finish
  py::object finish;    // None, or a callable whose return value synchronize() returns
  py::object consumer;  // None (wait on the host), or the CUDA device whose stream consumes it
  uintptr_t producer;   // with a consumer: the stream the inputs were ready on (0: ready now)
};

class HandleTable {
 public:
  int64_t Add(PendingCall call) {
    if (!orphans_.empty()) PruneOrphans();
    const int64_t id = next_id_++;
    calls_.emplace(id, std::move(call));
    return id;
  }
  void AddOrphan(Handle handle, py::object objects) {
    orphans_.emplace_back(std::move(handle), std::move(objects));
  }
  // Throws ValueError for a handle that is not pending.
  PendingCall Take(const py::handle& handle) {
    std::optional<PendingCall> call = TakeIfPending(handle);
    if (!call) throw Unknown(handle);
    return std::move(*call);
  }
  // Nothing for an integer that is no pending handle (one already synchronized), as Horovod's
  // synchronize finds nothing in its map for it; throws ValueError for what is no integer.
  std::optional<PendingCall> TakeIfPending(const py::handle& handle) {
    auto it = Search(handle);
    if (it == calls_.end()) return std::nullopt;
    PendingCall call = std::move(it->second);
    calls_.erase(it);
    return call;
  }
  const PendingCall& Find(const py::handle& handle) {
    auto it = Search(handle);
    if (it == calls_.end()) throw Unknown(handle);
    return it->second;
  }
  size_t size() const { return calls_.size(); }
  // After shutdown, when no operation can touch memory any more: every entry lets go of what it
  // kept alive for its operation, and one that failed of its result too (synchronize raises its
  // error), so that handles never synchronized hold no tensors across a restart. The objects are
  // released after the table is consistent: a finalizer may call back into it.
  void Settle() {
    std::vector<py::object> released;
    for (auto& [handle, objects] : std::exchange(orphans_, {})) released.push_back(objects);
    for (auto& [id, call] : calls_) {
      released.push_back(std::exchange(call.keep, py::none()));
      bool failed = false;
      for (const Handle& h : call.handles) failed = failed || (h.poll() && !h.status().ok());
      if (failed) {
        released.push_back(std::exchange(call.result, py::none()));
        released.push_back(std::exchange(call.finish, py::none()));
      }
    }
  }

 private:
  // Lets go of what orphaned handles kept once their operations are done; the objects are released
  // after the list is consistent, as in Settle.
  void PruneOrphans() {
    std::vector<py::object> released;
    auto done = [&](std::pair<Handle, py::object>& orphan) {
      if (!orphan.first.poll()) return false;
      released.push_back(std::move(orphan.second));
      return true;
    };
    orphans_.erase(std::remove_if(orphans_.begin(), orphans_.end(), done), orphans_.end());
  }

  // The entry of an integer handle, or end(); throws ValueError for what is no integer.
  std::unordered_map<int64_t, PendingCall>::iterator Search(const py::handle& handle) {
    if (!PyLong_Check(handle.ptr())) throw Unknown(handle);
    int overflow = 0;
    const long long id = PyLong_AsLongLongAndOverflow(handle.ptr(), &overflow);
    return overflow == 0 ? calls_.find(id) : calls_.end();
  }
  static py::value_error Unknown(const py::handle& handle) {
    const std::string shown = py::repr(handle);
    return py::value_error("unknown handle " + shown + " (already synchronized?)");
  }

  std::unordered_map<int64_t, PendingCall> calls_;
  int64_t next_id_ = 1;
  // Handles dropped before they were registered, and what their operations read or write.
  std::vector<std::pair<Handle, py::object>> orphans_;
};

// Never destroyed: the objects it may still hold at exit must not be released after the
// interpreter has gone.
HandleTable& Table() {
  static auto* table = new HandleTable;
  return *table;
}

bool AllDone(const std::vector<Handle>& handles) {
  for (const Handle& h : handles)
    if (!h.poll()) return false;
  return true;
}

// Waits on the host for every one of `handles`, also after one has failed: the others' tensors are
// released with their call, and must outlive what the operations still write. Returns the first
// failure.
std::optional<Error> WaitAllOnHost(const std::vector<Handle>& handles) {
  std::optional<Error> first;
  const auto wait_all = [&] {
    for (const Handle& h : handles) {
      try {
        h.wait();
      } catch (const Error& e) {
        if (!first) first = e;
      }
    }
  };
  if (AllDone(handles)) {
    wait_all();  // returns at once
  } else {
    py::gil_scoped_release release;
    wait_all();
  }
  return first;
}

// Orders `stream` after every one of `handles` (synchronize_stream goes on past a failure).
std::optional<Error> OrderStream(const std::vector<Handle>& handles, uintptr_t stream) {
  py::gil_scoped_release release;
  try {
    synchronize_stream(handles, reinterpret_cast<void*>(stream));
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// Waits for `calls` as their consumers want: on the host, or with each consumer device's current
// stream (`stream_of(consumer)`) ordered after all of that device's calls in one
// synchronize_stream, which waits once for each bucket's completion however many of the calls it
// carries. A call whose consumer stream is not its producer's has `record_consumer(keep,
// producer)` called: its tensors go back to the caching allocator when they are released, and
// only a consumer stream that is their producer's is ordered before their memory's next use
// without being told. Every call is waited for or ordered before a failure is raised, the first
// runtime failure before a Python one. Returns each call's result, in order.
py::list Synchronize(const std::vector<PendingCall>& calls, const py::object& stream_of,
                     const py::object& record_consumer) {
  std::vector<Handle> on_host;
  std::vector<std::pair<py::object, std::vector<Handle>>> on_device;  // by consumer
  for (const PendingCall& call : calls) {
    std::vector<Handle>* into = &on_host;
    if (!call.consumer.is_none()) {
      auto it = std::find_if(on_device.begin(), on_device.end(),
                             [&](const auto& device) { return device.first.equal(call.consumer); });
      if (it == on_device.end()) it = on_device.insert(it, {call.consumer, {}});
      into = &it->second;
    }
    into->insert(into->end(), call.handles.begin(), call.handles.end());
  }
  std::optional<Error> failure;
  const auto keep_first = [&](std::optional<Error> e) {
    if (e && !failure) failure = std::move(e);
  };
  std::exception_ptr python_failure;
  if (!on_host.empty()) keep_first(WaitAllOnHost(on_host));
  for (const auto& [consumer, handles] : on_device) {
    uintptr_t stream = 0;
    try {
      stream = stream_of(consumer).cast<uintptr_t>();
    } catch (...) {
      // No stream to order: the host waits instead.
      if (!python_failure) python_failure = std::current_exception();
      keep_first(WaitAllOnHost(handles));
      continue;
    }
    keep_first(OrderStream(handles, stream));
    for (const PendingCall& call : calls) {
      if (call.producer == 0 || call.producer == stream || !call.consumer.equal(consumer)) continue;
      try {
        record_consumer(call.keep, call.producer);
      } catch (...) {
        if (!python_failure) python_failure = std::current_exception();
      }
    }
  }
  if (failure) RaiseWaitError(*failure);
  if (python_failure) std::rethrow_exception(python_failure);
  py::list results;
  for (const PendingCall& call : calls) {
    results.append(call.finish.is_none() ? call.result : call.finish());
  }
  return results;
}

}  // namespace

Kept::~Kept() {
  if (!objects_.is_none() && !handle_.poll()) Table().AddOrphan(handle_, std::move(objects_));
}

py::int_ RegisterCall(std::vector<Handle> handles, py::object keep, py::object result,
                      py::object finish, py::object consumer, uintptr_t producer) {
  return py::int_(Table().Add(PendingCall{std::move(handles), std::move(keep), std::move(result),
                                          std::move(finish), std::move(consumer), producer}));
}

void BindHandleTable(py::module_& m) {
  m.def(
      "register_handle",
      [](const std::vector<PyHandle>& handles, py::object keep, py::object finish,
         py::object consumer, uintptr_t producer) {
        std::vector<Handle> runtime;
        runtime.reserve(handles.size());
        for (const PyHandle& h : handles) {
          runtime.push_back(h.handle);
          if (h.kept != nullptr) h.kept->Release();
        }
        return RegisterCall(std::move(runtime), std::move(keep), py::none(), std::move(finish),
                            std::move(consumer), producer);
      },
      py::arg("handles"), py::arg("keep"), py::arg("finish"), py::arg("consumer") = py::none(),
      py::arg("producer") = 0);
  // `stream_of(consumer)` gives the cudaStream_t current on a consumer device, as an integer:
  // looked up at synchronize time, where the caller's current stream is the one to order.
  // `record_consumer(keep, producer)` is called for a call consumed on another stream than its
  // producer (see Synchronize). An integer that is no pending handle gives None, as Horovod's
  // synchronize does for a handle already synchronized.
  m.def("synchronize_handle", [](const py::handle& handle, const py::object& stream_of,
                                 const py::object& record_consumer) {
    std::optional<PendingCall> call = Table().TakeIfPending(handle);
    if (!call) return py::object(py::none());
    std::vector<PendingCall> calls;
    calls.push_back(std::move(*call));
    const py::list results = Synchronize(calls, stream_of, record_consumer);
    return py::object(results[0]);
  });
  // As synchronize_handle on each in turn, but in one call, so that a step's gradients reduced
  // in calls of their own (compressed, grouped) wait once for each bucket. Every handle is known,
  // and listed once, before any is taken; a failure raises after every handle was waited for.
  m.def("synchronize_handles", [](const py::list& handles, const py::object& stream_of,
                                  const py::object& record_consumer) {
    std::unordered_set<const PendingCall*> listed;
    for (const py::handle& h : handles) {
      if (!listed.insert(&Table().Find(h)).second) {
        throw py::value_error("handle " + std::string(py::repr(h)) + " is listed twice");
      }
    }
    std::vector<PendingCall> calls;
    calls.reserve(handles.size());
    for (const py::handle& h : handles) calls.push_back(Table().Take(h));
    return Synchronize(calls, stream_of, record_consumer);
  });
  m.def("poll_handle",
        [](const py::handle& handle) { return AllDone(Table().Find(handle).handles); });
  m.def("pending_handles", [] { return Table().size(); });
  m.def("settle_handles", [] { Table().Settle(); });
}

}  // namespace python
}  // namespace gradsync
