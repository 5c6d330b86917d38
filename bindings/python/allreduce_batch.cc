// gradsync._core.AllreduceBatch: a fixed list of tensors, a model's gradients, each reduced in
// place once per step as soon as it is ready, then all waited for at once. It is the hot path of
// gradsync.torch's DistributedOptimizer: every slot's name, dtype, shape, device and reduction are
// converted here once, so that starting one crosses from Python with two integers, and a step's
// wait releases the GIL once rather than once per tensor.
//
// Calls come from Python with the GIL held (autograd's hooks included), so they never overlap.
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core_module.h"

namespace gradsync {
namespace python {
namespace {

class AllreduceBatch {
 public:
  // One slot per tensor, the lists in step; `names` as the runtime sees them (the same on every
  // rank). The reduction (op, scales, process set) is the whole batch's.
  AllreduceBatch(std::vector<std::string> names, const std::vector<int>& dtypes,
                 const std::vector<std::vector<int64_t>>& shapes,
                 const std::vector<int>& device_kinds, const std::vector<int>& device_indices,
                 int op, double prescale, double postscale, int process_set) {
    const size_t n = names.size();
    if (dtypes.size() != n || shapes.size() != n || device_kinds.size() != n ||
        device_indices.size() != n) {
      throw Error(
          Status::InvalidArgument("AllreduceBatch needs one name, dtype, shape and "
                                  "device per tensor"));
    }
    const ProcessSet set = SetById(process_set);
    slots_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      Slot& slot = slots_[i];
      slot.view = View(0, dtypes[i], shapes[i], device_kinds[i], device_indices[i]);
      slot.options.name = std::move(names[i]);
      slot.options.op = static_cast<ReduceOp>(op);
      slot.options.prescale = prescale;
      slot.options.postscale = postscale;
      slot.options.process_set = set;
    }
    started_.reserve(n);
  }

  // Starts reducing slot `i` in place at `data`, which stays valid and untouched until wait().
  void Start(size_t i, uintptr_t data) {
    if (i >= slots_.size()) {
      throw Error(Status::InvalidArgument("AllreduceBatch has no slot " + std::to_string(i)));
    }
    Slot& slot = slots_[i];
    if (slot.handle.valid()) {
      throw Error(Status::InvalidArgument("tensor '" + slot.options.name +
                                          "' was started twice before wait()"));
    }
    slot.view.data = reinterpret_cast<void*>(data);
    slot.handle = allreduce(slot.view, slot.options);
    started_.push_back(i);
  }

  // Waits for every started slot, then forgets them; the first failure, if any, is thrown once
  // all have finished, so that no reduction still writes into a tensor the caller gets back.
  void Wait() {
    std::optional<Error> first_failure;
    {
      py::gil_scoped_release release;
      for (size_t i : started_) {
        try {
          slots_[i].handle.wait();
        } catch (const Error& e) {
          if (!first_failure) first_failure = e;
        }
        slots_[i].handle = Handle();
      }
    }
    started_.clear();
    if (first_failure) RaiseWaitError(*first_failure);
  }

  size_t in_flight() const { return started_.size(); }
  size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    TensorView view;
    AllreduceOptions options;
    Handle handle;  // valid while started and not yet waited for
  };
  std::vector<Slot> slots_;
  std::vector<size_t> started_;  // in start order
};

}  // namespace

void BindAllreduceBatch(py::module_& m) {
  py::class_<AllreduceBatch>(m, "AllreduceBatch")
      .def(py::init([](std::vector<std::string> names, const std::vector<int>& dtypes,
                       const std::vector<std::vector<int64_t>>& shapes,
                       const std::vector<int>& device_kinds, const std::vector<int>& device_indices,
                       int op, double prescale, double postscale, int process_set) {
             return Enqueue([&] {
               return new AllreduceBatch(std::move(names), dtypes, shapes, device_kinds,
                                         device_indices, op, prescale, postscale, process_set);
             });
           }),
           py::arg("names"), py::arg("dtypes"), py::arg("shapes"), py::arg("device_kinds"),
           py::arg("device_indices"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
           py::arg("process_set"))
      .def("start",
           [](AllreduceBatch& b, size_t i, uintptr_t data) { Enqueue([&] { b.Start(i, data); }); })
      .def("wait", &AllreduceBatch::Wait)
      .def("in_flight", &AllreduceBatch::in_flight)
      .def("__len__", &AllreduceBatch::size);
}

}  // namespace python
}  // namespace gradsync
