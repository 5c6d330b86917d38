// gradsync._core: the Python face of the C++ API, free of any framework. Tensors cross as raw
// data pointers with a dtype code and a shape, so the module builds once for every PyTorch (and
// any other array library) and nothing is copied on the way in. gradsync.torch maps tensors onto
// these calls.
//
// Threads: every call may be made from any Python thread. Calls that can block (wait, join, init,
// shutdown, process-set changes) release the GIL while they block, so other Python threads and
// the background thread's allocators never wait on it. No Python code runs on gradsync's
// background thread: outputs whose size is known only after negotiation are placed in buffers
// owned here (OutputBuffer) and handed to Python after the wait.
#include <gradsync/gradsync.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core_module.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using namespace pybind11::literals;

namespace gradsync {
namespace python {
// Memory for a collective's output, filled on the background thread, then exposed to Python: host
// memory through the buffer protocol (torch.frombuffer), device memory through
// __cuda_array_interface__ (torch.as_tensor); the tensor made from it keeps it alive.
class OutputBuffer {
 public:
  // `device`: the CUDA device of the collective's input, or -1 for a host input.
  explicit OutputBuffer(int device = -1) : device_(device) {}
  ~OutputBuffer() {
    if (device_ >= 0 && device_data_ != nullptr) {
      try {
        free_device_memory(device_, device_data_);
      } catch (const Error&) {
        // A failed device leaves nothing to return the memory to; its error reached the handle.
      }
    }
  }
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;

  // Runs on the background thread; nullptr fails the operation.
  void* Allocate(const std::vector<int64_t>& shape, DataType dtype) {
    shape_ = shape;
    int64_t bytes = static_cast<int64_t>(DataTypeSize(dtype));
    for (int64_t d : shape) bytes *= d;
    bytes_ = static_cast<size_t>(bytes);
    if (bytes_ == 0) return nullptr;
    if (device_ < 0) {
      host_data_.reset(new (std::nothrow) uint8_t[bytes_]);
      return host_data_.get();
    }
    try {
      device_data_ = allocate_device_memory(device_, bytes_);
    } catch (const Error&) {
      device_data_ = nullptr;
    }
    return device_data_;
  }
  void* data() const { return device_ >= 0 ? device_data_ : host_data_.get(); }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }

 private:
  int device_;
  std::unique_ptr<uint8_t[]> host_data_;
  void* device_data_ = nullptr;
  size_t bytes_ = 0;
  std::vector<int64_t> shape_;
};

namespace {

// The output buffer of a collective whose input is on (device_kind, device_index).
std::shared_ptr<OutputBuffer> OutputFor(int device_kind, int device_index) {
  const bool on_device = static_cast<DeviceKind>(device_kind) != DeviceKind::kCpu;
  return std::make_shared<OutputBuffer>(on_device ? device_index : -1);
}

Allocator AllocatorInto(const std::shared_ptr<OutputBuffer>& buffer) {
  return [buffer](const std::vector<int64_t>& shape, DataType dtype) {
    return buffer->Allocate(shape, dtype);
  };
}

// One output buffer and allocator per tensor of a grouped call.
struct GroupOutputs {
  GroupOutputs(size_t n, int device_kind, int device_index) {
    for (size_t i = 0; i < n; ++i) {
      buffers.push_back(OutputFor(device_kind, device_index));
      allocators.push_back(AllocatorInto(buffers.back()));
    }
  }
  std::vector<PyHandle> Wrap(const std::vector<Handle>& handles, const py::object& keep) const {
    std::vector<PyHandle> out;
    for (size_t i = 0; i < handles.size(); ++i) {
      out.push_back(PyHandle{handles[i], buffers[i], std::make_shared<Kept>(handles[i], keep)});
    }
    return out;
  }
  std::vector<std::shared_ptr<OutputBuffer>> buffers;
  std::vector<Allocator> allocators;
};

}  // namespace

Exceptions* g_exceptions = nullptr;

[[noreturn]] void Raise(const py::object& type, const Status& status) {
  py::object error = type(status.ToString());
  error.attr("code") = StatusCodeName(status.code());
  PyErr_SetObject(type.ptr(), error.ptr());
  throw py::error_already_set();
}

[[noreturn]] void RaiseError(const Error& e, const py::object& otherwise) {
  const bool value =
      e.code() == StatusCode::kInvalidArgument || e.code() == StatusCode::kNotInitialized;
  Raise(value ? g_exceptions->value_error : otherwise, e.status());
}

TensorView View(uintptr_t data, int dtype, std::vector<int64_t> shape, int device_kind,
                int device_index) {
  return TensorView(reinterpret_cast<void*>(data), static_cast<DataType>(dtype), std::move(shape),
                    Device{static_cast<DeviceKind>(device_kind), device_index});
}

std::vector<TensorView> Views(const std::vector<uintptr_t>& data, const std::vector<int>& dtypes,
                              std::vector<std::vector<int64_t>> shapes, int device_kind,
                              int device_index) {
  if (dtypes.size() != data.size() || shapes.size() != data.size())
    throw Error(Status::InvalidArgument("a group needs one dtype and one shape per tensor"));
  std::vector<TensorView> views;
  for (size_t i = 0; i < data.size(); ++i)
    views.push_back(View(data[i], dtypes[i], std::move(shapes[i]), device_kind, device_index));
  return views;
}

ProcessSet SetById(int id) {
  if (id == 0) return ProcessSet();  // the global set, always there: no registry walk per call
  for (const ProcessSet& set : process_sets())
    if (set.id() == id) return set;
  throw Error(Status::InvalidArgument("process set " + std::to_string(id) +
                                      " does not exist (it was never added or was removed)"));
}

namespace {

// The reduction fields that allreduce, grouped allreduce and reducescatter options share.
template <typename Options>
void SetReduction(Options* o, int op, double prescale, double postscale, int process_set) {
  o->op = static_cast<ReduceOp>(op);
  o->prescale = prescale;
  o->postscale = postscale;
  o->process_set = SetById(process_set);
}

// A device input's producer, as Python passes it: the cudaStream_t current where the tensor was
// made (torch.cuda.current_stream().cuda_stream), or 0 for an input that is ready now.
DeviceReadiness ReadyOn(uintptr_t stream) {
  DeviceReadiness ready;
  ready.cuda_stream = reinterpret_cast<void*>(stream);
  return ready;
}

void Wait(const PyHandle& h) {
  try {
    py::gil_scoped_release release;
    h.handle.wait();
  } catch (const Error& e) {
    RaiseWaitError(e);
  }
}

bool MpiThreadsSupported() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return false;  // MPI_Query_thread is erroneous after finalize
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

void BindRuntime(py::module_& m) {
  m.def(
      "init",
      [](int64_t comm_fint, std::vector<std::vector<int>> sets) {
        InitOptions options;
        options.comm =
            comm_fint < 0 ? MPI_COMM_WORLD : MPI_Comm_f2c(static_cast<MPI_Fint>(comm_fint));
        options.process_sets = std::move(sets);
        Enqueue([&] {
          py::gil_scoped_release release;
          init(options);
        });
      },
      py::arg("comm_fint") = -1, py::arg("process_sets") = std::vector<std::vector<int>>{});
  m.def("shutdown", [] {
    py::gil_scoped_release release;
    shutdown();
  });
  m.def("is_initialized", &is_initialized);
  m.def("rank", [] { return Enqueue([] { return rank(); }); });
  m.def("size", [] { return Enqueue([] { return size(); }); });
  m.def("local_rank", [] { return Enqueue([] { return local_rank(); }); });
  m.def("local_size", [] { return Enqueue([] { return local_size(); }); });
  m.def("cross_rank", [] { return Enqueue([] { return cross_rank(); }); });
  m.def("cross_size", [] { return Enqueue([] { return cross_size(); }); });
  m.def("gpu_device", [] { return Enqueue([] { return gpu_device(); }); });
  m.def("mpi_threads_supported", &MpiThreadsSupported);
  m.def("built_with_cuda", &cuda_built);
  m.def("nccl_version", &nccl_version);
  m.def("start_timeline", [](const std::string& path) { Enqueue([&] { start_timeline(path); }); });
  m.def("stop_timeline", [] { Enqueue([] { stop_timeline(); }); });
  m.def("join", [] {
    return Enqueue([] {
      py::gil_scoped_release release;
      return join();
    });
  });
  m.def("add_process_set", [](const std::vector<int>& ranks) {
    return Enqueue([&] {
      py::gil_scoped_release release;
      return add_process_set(ranks).id();
    });
  });
  m.def("remove_process_set", [](int id) {
    Enqueue([&] {
      const ProcessSet set = SetById(id);
      py::gil_scoped_release release;
      remove_process_set(set);
    });
  });
  m.def("process_set_ids", [] {
    std::vector<int> ids;
    for (const ProcessSet& set : Enqueue([] { return process_sets(); })) ids.push_back(set.id());
    return ids;
  });
  m.def("process_set_ranks", [](int id) { return Enqueue([&] { return SetById(id).ranks(); }); });
}

void BindHandle(py::module_& m) {
  py::class_<OutputBuffer, std::shared_ptr<OutputBuffer>>(m, "OutputBuffer", py::buffer_protocol())
      .def_buffer([](OutputBuffer& b) {
        if (b.device() >= 0) throw py::buffer_error("a device output has no host buffer");
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.bytes())}, {1}, /*readonly=*/false);
      })
      // Bytes, as the buffer protocol gives a host output; absent (so hasattr() is False) there.
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const OutputBuffer& b) {
            if (b.device() < 0) throw py::attribute_error("a host output has no device memory");
            return py::dict("shape"_a = py::make_tuple(b.bytes()), "strides"_a = py::none(),
                            "typestr"_a = "|u1",
                            "data"_a = py::make_tuple(reinterpret_cast<uintptr_t>(b.data()), false),
                            "version"_a = 2);
          })
      .def_property_readonly("device", &OutputBuffer::device)
      .def_property_readonly("nbytes", &OutputBuffer::bytes)
      .def_property_readonly("shape", &OutputBuffer::shape);

  py::class_<PyHandle>(m, "Handle")
      .def("wait", &Wait)
      .def("poll", [](const PyHandle& h) { return h.handle.poll(); })
      .def("synchronize_stream",
           [](const PyHandle& h, uintptr_t stream) {
             try {
               py::gil_scoped_release release;
               h.handle.synchronize_stream(reinterpret_cast<void*>(stream));
             } catch (const Error& e) {
               RaiseWaitError(e);
             }
           })
      .def_readonly("output", &PyHandle::output)
      .def("output_shape", [](const PyHandle& h) { return h.handle.output_shape(); })
      .def("received_splits", [](const PyHandle& h) { return h.handle.received_splits(); });
}

void BindCollectives(py::module_& m) {
  // allreduce and grouped_allreduce return gradsync.torch's integer handles (handle_table.cc):
  // every gradient of a step goes through them, and one call each way is what they cost.
  m.def("allreduce",
        [](uintptr_t in, uintptr_t out, int dtype, std::vector<int64_t> shape, int device_kind,
           int device_index, std::string name, int op, double prescale, double postscale,
           int process_set, uintptr_t ready_stream, py::object keep, py::object result,
           py::object finish, py::object consumer) {
          Handle h = Enqueue([&] {
            AllreduceOptions o;
            o.name = std::move(name);
            SetReduction(&o, op, prescale, postscale, process_set);
            o.ready = ReadyOn(ready_stream);
            const TensorView input = View(in, dtype, shape, device_kind, device_index);
            const TensorView output = View(out, dtype, std::move(shape), device_kind, device_index);
            return allreduce(input, output, o);
          });
          return RegisterCall({std::move(h)}, std::move(keep), std::move(result), std::move(finish),
                              std::move(consumer), ready_stream);
        });
  m.def("grouped_allreduce",
        [](std::vector<uintptr_t> data, std::vector<int> dtypes,
           std::vector<std::vector<int64_t>> shapes, int device_kind, int device_index,
           std::vector<std::string> names, int op, double prescale, double postscale,
           int process_set, uintptr_t ready_stream, py::object keep, py::object result,
           py::object finish, py::object consumer) {
          std::vector<Handle> handles = Enqueue([&] {
            GroupedAllreduceOptions o;
            o.names = std::move(names);
            SetReduction(&o, op, prescale, postscale, process_set);
            o.ready = ReadyOn(ready_stream);
            return grouped_allreduce(
                Views(data, dtypes, std::move(shapes), device_kind, device_index), o);
          });
          return RegisterCall(std::move(handles), std::move(keep), std::move(result),
                              std::move(finish), std::move(consumer), ready_stream);
        });
  m.def("allgather",
        [](uintptr_t data, int dtype, std::vector<int64_t> shape, int device_kind, int device_index,
           std::string name, int process_set, uintptr_t ready_stream, py::object keep) {
          return Enqueue([&] {
            AllgatherOptions o;
            o.name = std::move(name);
            o.process_set = SetById(process_set);
            o.ready = ReadyOn(ready_stream);
            auto buffer = OutputFor(device_kind, device_index);
            Handle h = allgather(View(data, dtype, std::move(shape), device_kind, device_index),
                                 AllocatorInto(buffer), o);
            return PyHandle{h, buffer, std::make_shared<Kept>(h, std::move(keep))};
          });
        });
  m.def("grouped_allgather", [](std::vector<uintptr_t> data, std::vector<int> dtypes,
                                std::vector<std::vector<int64_t>> shapes, int device_kind,
                                int device_index, std::vector<std::string> names, int process_set,
                                uintptr_t ready_stream, py::object keep) {
    return Enqueue([&] {
      GroupedAllgatherOptions o;
      o.names = std::move(names);
      o.process_set = SetById(process_set);
      o.ready = ReadyOn(ready_stream);
      GroupOutputs outputs(data.size(), device_kind, device_index);
      return outputs.Wrap(
          grouped_allgather(Views(data, dtypes, std::move(shapes), device_kind, device_index),
                            outputs.allocators, o),
          keep);
    });
  });
  m.def("broadcast", [](uintptr_t data, int dtype, std::vector<int64_t> shape, int device_kind,
                        int device_index, int root, std::string name, int process_set,
                        uintptr_t ready_stream, py::object keep) {
    return Enqueue([&] {
      BroadcastOptions o;
      o.name = std::move(name);
      o.process_set = SetById(process_set);
      o.ready = ReadyOn(ready_stream);
      Handle h = broadcast(View(data, dtype, std::move(shape), device_kind, device_index), root, o);
      return PyHandle{h, nullptr, std::make_shared<Kept>(h, std::move(keep))};
    });
  });
  m.def("alltoall", [](uintptr_t data, int dtype, std::vector<int64_t> shape, int device_kind,
                       int device_index, std::vector<int64_t> splits, std::string name,
                       int process_set, uintptr_t ready_stream, py::object keep) {
    return Enqueue([&] {
      AlltoallOptions o;
      o.name = std::move(name);
      o.splits = std::move(splits);
      o.process_set = SetById(process_set);
      o.ready = ReadyOn(ready_stream);
      auto buffer = OutputFor(device_kind, device_index);
      Handle h = alltoall(View(data, dtype, std::move(shape), device_kind, device_index),
                          AllocatorInto(buffer), o);
      return PyHandle{h, buffer, std::make_shared<Kept>(h, std::move(keep))};
    });
  });
  m.def("reducescatter", [](std::vector<uintptr_t> data, std::vector<int> dtypes,
                            std::vector<std::vector<int64_t>> shapes, int device_kind,
                            int device_index, std::vector<std::string> names, int op,
                            double prescale, double postscale, int process_set,
                            uintptr_t ready_stream, py::object keep) {
    return Enqueue([&] {
      GroupedReducescatterOptions o;
      o.names = std::move(names);
      SetReduction(&o, op, prescale, postscale, process_set);
      o.ready = ReadyOn(ready_stream);
      GroupOutputs outputs(data.size(), device_kind, device_index);
      return outputs.Wrap(
          grouped_reducescatter(Views(data, dtypes, std::move(shapes), device_kind, device_index),
                                outputs.allocators, o),
          keep);
    });
  });
  m.def("barrier", [](int process_set) {
    return Enqueue([&] { return PyHandle{barrier("", SetById(process_set)), nullptr, nullptr}; });
  });
}

}  // namespace
}  // namespace python
}  // namespace gradsync

PYBIND11_MODULE(_core, m) {
  using namespace gradsync::python;
  m.doc() = "gradsync's C++ runtime, over raw data pointers; use gradsync.torch";
  // Never destroyed: the interpreter may be gone by the time static destructors run.
  static Exceptions& exceptions = *new Exceptions;
  exceptions.base = py::register_exception<gradsync::Error>(m, "GradsyncError", PyExc_RuntimeError);
  py::object builtins = py::module_::import("builtins");
  py::object type = builtins.attr("type");
  exceptions.base.attr("__module__") = "gradsync";
  exceptions.value_error =
      type("GradsyncValueError", py::make_tuple(exceptions.base, builtins.attr("ValueError")),
           py::dict("__module__"_a = "gradsync"));
  exceptions.internal = type("GradsyncInternalError", py::make_tuple(exceptions.base),
                             py::dict("__module__"_a = "gradsync"));
  m.attr("GradsyncValueError") = exceptions.value_error;
  m.attr("GradsyncInternalError") = exceptions.internal;
  g_exceptions = &exceptions;
  BindRuntime(m);
  BindHandle(m);
  BindCollectives(m);
  BindAllreduceBatch(m);
  BindHandleTable(m);
}
