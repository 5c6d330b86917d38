// gradsync._core.AllreduceBatch: gradsync::AllreduceBatch for Python, the hot path of
// gradsync.torch's DistributedOptimizer: every tensor's name, dtype, shape and device are converted
// once, so that starting one crosses from Python with two integers, and a step's wait releases the
// GIL once rather than once per tensor.
//
// Calls come from Python with the GIL held (autograd's hooks included), so they never overlap.
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core_module.h"

namespace gradsync {
namespace python {
namespace {

// Destroying a batch may wait: for reductions in flight (their memory is in use until then), and
// for the lane table, which the background thread holds across a collective with the other ranks
// as it grants a lane. Without the GIL, as wait() does, so that other Python threads and signal
// handlers run meanwhile, and a peer that never comes holds this thread alone.
struct DestroyWithoutTheGil {
  void operator()(AllreduceBatch* batch) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      delete batch;
    } else {
      delete batch;
    }
  }
};

// The batch as Python holds it.
using HeldBatch = std::unique_ptr<AllreduceBatch, DestroyWithoutTheGil>;

HeldBatch MakeBatch(std::vector<std::string> names, const std::vector<int>& dtypes,
                    const std::vector<std::vector<int64_t>>& shapes,
                    const std::vector<int>& device_kinds, const std::vector<int>& device_indices,
                    int op, double prescale, double postscale, int process_set) {
  const size_t n = names.size();
  if (dtypes.size() != n || shapes.size() != n || device_kinds.size() != n ||
      device_indices.size() != n) {
    throw Error(Status::InvalidArgument(
        "AllreduceBatch needs one name, dtype, shape and device per tensor"));
  }
  std::vector<TensorView> tensors;
  tensors.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    tensors.push_back(View(0, dtypes[i], shapes[i], device_kinds[i], device_indices[i]));
  }
  AllreduceBatchOptions options;
  options.names = std::move(names);
  options.op = static_cast<ReduceOp>(op);
  options.prescale = prescale;
  options.postscale = postscale;
  options.process_set = SetById(process_set);
  return HeldBatch(new AllreduceBatch(tensors, options));
}

}  // namespace

void BindAllreduceBatch(py::module_& m) {
  // Starting slot `i` at `data`: the memory stays valid and untouched until wait(). wait() throws
  // the first failure once every reduction has finished, so that none still writes into a tensor
  // the caller gets back.
  py::class_<AllreduceBatch, HeldBatch>(m, "AllreduceBatch")
      .def(py::init([](std::vector<std::string> names, const std::vector<int>& dtypes,
                       const std::vector<std::vector<int64_t>>& shapes,
                       const std::vector<int>& device_kinds, const std::vector<int>& device_indices,
                       int op, double prescale, double postscale, int process_set) {
             return Enqueue([&] {
               return MakeBatch(std::move(names), dtypes, shapes, device_kinds, device_indices, op,
                                prescale, postscale, process_set);
             });
           }),
           py::arg("names"), py::arg("dtypes"), py::arg("shapes"), py::arg("device_kinds"),
           py::arg("device_indices"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
           py::arg("process_set"))
      // `ready_stream`: a device tensor's producer stream (a cudaStream_t), 0 when it is ready.
      .def(
          "start",
          [](AllreduceBatch& b, size_t i, uintptr_t data, uintptr_t ready_stream) {
            Enqueue([&] {
              if (ready_stream == 0) {
                b.start(i, reinterpret_cast<void*>(data));
              } else {
                DeviceReadiness ready;
                ready.cuda_stream = reinterpret_cast<void*>(ready_stream);
                b.start(i, reinterpret_cast<void*>(data), ready);
              }
            });
          },
          py::arg("index"), py::arg("data"), py::arg("ready_stream") = 0)
      .def("wait",
           [](AllreduceBatch& b) {
             try {
               py::gil_scoped_release release;
               b.wait();
             } catch (const Error& e) {
               RaiseWaitError(e);
             }
           })
      .def("synchronize_stream",
           [](AllreduceBatch& b, uintptr_t stream) {
             try {
               py::gil_scoped_release release;
               b.synchronize_stream(reinterpret_cast<void*>(stream));
             } catch (const Error& e) {
               RaiseWaitError(e);
             }
           })
      .def("in_flight", &AllreduceBatch::in_flight)
      .def("bucket_count", &AllreduceBatch::bucket_count)
      .def("caller_reductions", &AllreduceBatch::caller_reductions)
      .def("__len__", &AllreduceBatch::size);
}

}  // namespace python
}  // namespace gradsync
