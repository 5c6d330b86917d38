// What the sources of gradsync._core share: how runtime errors become Python exceptions, and how
// raw pointers, dtype codes and process-set ids become the C++ API's types. Used with the GIL held.
#pragma once

#include <gradsync/gradsync.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace gradsync {
namespace python {

// Python's GradsyncError and its subclasses, created at import (see PYBIND11_MODULE).
struct Exceptions {
  py::object base;         // GradsyncError(RuntimeError): every failure, with .code
  py::object value_error;  // GradsyncValueError(GradsyncError, ValueError): bad input, no init
  py::object internal;     // GradsyncInternalError(GradsyncError): a collective failed at wait
};
extern Exceptions* g_exceptions;

[[noreturn]] void Raise(const py::object& type, const Status& status);
// Bad arguments and calls before init read as ValueError, as Horovod's do; any other failure as
// `otherwise`.
[[noreturn]] void RaiseError(const Error& e, const py::object& otherwise);
// A failure seen by a wait: anything but bad arguments (a mismatch, a stall, a shutdown) reads as
// GradsyncInternalError, Horovod's HorovodInternalError.
[[noreturn]] inline void RaiseWaitError(const Error& e) { RaiseError(e, g_exceptions->internal); }

// Enqueue-time errors: anything but bad arguments reads as GradsyncError.
template <typename F>
auto Enqueue(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    RaiseError(e, g_exceptions->base);
  }
}

TensorView View(uintptr_t data, int dtype, std::vector<int64_t> shape, int device_kind,
                int device_index);
std::vector<TensorView> Views(const std::vector<uintptr_t>& data, const std::vector<int>& dtypes,
                              std::vector<std::vector<int64_t>> shapes, int device_kind,
                              int device_index);
// Throws Error (InvalidArgument) when no set has `id`.
ProcessSet SetById(int id);

// Memory for a collective's output whose size only negotiation tells (core_module.cc).
class OutputBuffer;

// What a pending operation reads or writes, held by its _core.Handle until the handle is
// registered (RegisterCall's entry holds it then). A handle dropped unregistered while its
// operation may still run (a KeyboardInterrupt between the enqueue and the registration) hands it
// to the handle table, which lets go of it once the operation is done (at a later registration,
// or at settle_handles), rather than releasing memory the operation may still read or write. Made
// and destroyed with the GIL held.
class Kept {
 public:
  Kept(Handle handle, py::object objects)
      : handle_(std::move(handle)), objects_(std::move(objects)) {}
  ~Kept();
  Kept(const Kept&) = delete;
  Kept& operator=(const Kept&) = delete;
  // Registered: the table's entry holds the objects from now on.
  void Release() { objects_ = py::none(); }

 private:
  Handle handle_;
  py::object objects_;
};

// _core.Handle: a pending operation and, for collectives that allocate their result, its output
// buffer.
struct PyHandle {
  Handle handle;
  std::shared_ptr<OutputBuffer> output;
  std::shared_ptr<Kept> kept;  // null where the caller keeps its tensors itself
};

// A new integer handle for gradsync.torch (handle_table.cc): synchronize_handle() waits for
// `handles` (on the host, or ordering the current stream of the CUDA device `consumer`), then
// returns `finish()`, or `result` when `finish` is None. `keep` stays alive until then.
// `producer`: the cudaStream_t the inputs were ready on, 0 for host tensors.
py::int_ RegisterCall(std::vector<Handle> handles, py::object keep, py::object result,
                      py::object finish, py::object consumer, uintptr_t producer);
// register_handle, synchronize_handle, poll_handle, pending_handles, settle_handles.
void BindHandleTable(py::module_& m);

// gradsync._core.AllreduceBatch (allreduce_batch.cc).
void BindAllreduceBatch(py::module_& m);

}  // namespace python
}  // namespace gradsync
