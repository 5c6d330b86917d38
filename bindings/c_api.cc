// The C API (<gradsync/c_api.h>) over the C++ one: arguments checked here, every exception caught
// and turned into a code and the calling thread's message.
#include "gradsync/c_api.h"

#include <mpi.h>

#include <exception>
#include <new>
#include <string>
#include <vector>

#include "bindings/runtime.h"
#include "gradsync/gradsync.h"

struct gradsync_handle {
  gradsync::Handle handle;
  // The output of an allgather, reducescatter or alltoall, which gradsync allocates here.
  std::vector<unsigned char> output;
  std::vector<int64_t> output_shape;
  gradsync::DataType output_dtype = gradsync::DataType::kFloat32;
  std::vector<int64_t> received_splits;
  bool finished = false;  // output_shape and received_splits filled
};

namespace gradsync {
namespace {

constexpr int kMaxDims = 64;
// GRADSYNC_OK as an int, so that lambdas returning it and an error code deduce one type.
constexpr int kOk = GRADSYNC_OK;

thread_local std::string t_last_error;

int Fail(StatusCode code, const std::string& message) {
  t_last_error = message;
  return static_cast<int>(code);
}

int Fail(const Status& status) { return Fail(status.code(), status.ToString()); }

int Invalid(const std::string& message) {
  return Fail(StatusCode::kInvalidArgument, "InvalidArgument: " + message);
}

// Runs `body` (returning a code) with every exception turned into a code and message.
template <typename Body>
int Guarded(const char* call, Body body) noexcept {
  try {
    return body();
  } catch (const Error& e) {
    return Fail(e.status());
  } catch (const std::bad_alloc&) {
    return Fail(StatusCode::kInternal, std::string(call) + ": out of memory");
  } catch (const std::exception& e) {
    return Fail(StatusCode::kInternal, std::string(call) + ": " + e.what());
  } catch (...) {
    return Fail(StatusCode::kInternal, std::string(call) + ": an unknown exception");
  }
}

int CheckOut(const void* pointer, const char* call, const char* what) {
  if (pointer != nullptr) return kOk;
  return Invalid(std::string(call) + ": " + what + " is NULL");
}

int CheckDtype(int dtype, const char* call) {
  if (dtype >= 0 && dtype < kNumDataTypes) return kOk;
  return Invalid(std::string(call) + ": unknown dtype " + std::to_string(dtype));
}

int CheckOp(int op, const char* call) {
  if (op >= 0 && op < kNumReduceOps) return kOk;
  return Invalid(std::string(call) + ": unknown reduce op " + std::to_string(op));
}

// A view of caller memory, after the C-level checks (the C++ API checks the rest).
int MakeView(const char* call, const void* data, int dtype, const int64_t* shape, int ndim,
             TensorView* view) {
  if (int rc = CheckDtype(dtype, call)) return rc;
  if (ndim < 0 || ndim > kMaxDims) {
    return Invalid(std::string(call) + ": ndim " + std::to_string(ndim) + " is outside [0, " +
                   std::to_string(kMaxDims) + "]");
  }
  if (ndim > 0 && shape == nullptr) return Invalid(std::string(call) + ": shape is NULL");
  std::vector<int64_t> dims(shape, shape + ndim);
  *view = TensorView(const_cast<void*>(data), static_cast<DataType>(dtype), std::move(dims));
  return kOk;
}

int SetProcessSet(int id, const char* call, ProcessSet* set) {
  if (id < 0) return Invalid(std::string(call) + ": negative process set id " + std::to_string(id));
  *set = MakeProcessSet(id);
  return kOk;
}

std::string Name(const char* name) { return name == nullptr ? std::string() : std::string(name); }

// The allocator of a collective that allocates its output: into the handle.
Allocator IntoHandle(gradsync_handle* h) {
  return [h](const std::vector<int64_t>& shape, DataType dtype) -> void* {
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;
    h->output.resize(static_cast<size_t>(elements) * DataTypeSize(dtype));
    h->output_shape = shape;
    h->output_dtype = dtype;
    return h->output.empty() ? nullptr : h->output.data();
  };
}

// A new handle for `handle`'s caller, or the failure.
int Allocated(gradsync_handle** out, const char* call) {
  if (int rc = CheckOut(out, call, "handle")) return rc;
  *out = new gradsync_handle;
  return kOk;
}

// Enqueues through `enqueue` (which fills h->handle); frees the handle when it throws.
template <typename Enqueue>
int Submit(const char* call, gradsync_handle** out, Enqueue enqueue) {
  if (int rc = Allocated(out, call)) return rc;
  gradsync_handle* h = *out;
  const int rc = Guarded(call, [&] {
    enqueue(h);
    return kOk;
  });
  if (rc != GRADSYNC_OK) {
    delete h;
    *out = nullptr;
  }
  return rc;
}

// The grouped forms' views, after checking every array.
int MakeViews(const char* call, int count, const void* const* data, const int* dtypes,
              const int64_t* const* shapes, const int* ndims, std::vector<TensorView>* views) {
  if (count < 0) return Invalid(std::string(call) + ": negative count " + std::to_string(count));
  if (count == 0) return kOk;
  if (data == nullptr || dtypes == nullptr || shapes == nullptr || ndims == nullptr) {
    return Invalid(std::string(call) + ": data, dtypes, shapes and ndims must all be given");
  }
  views->resize(count);
  for (int i = 0; i < count; ++i) {
    if (int rc = MakeView(call, data[i], dtypes[i], shapes[i], ndims[i], &(*views)[i])) return rc;
  }
  return kOk;
}

std::vector<std::string> Names(int count, const char* const* names) {
  std::vector<std::string> out;
  if (names == nullptr) return out;
  for (int i = 0; i < count; ++i) out.push_back(Name(names[i]));
  return out;
}

// Grouped enqueues: `count` handles, all made or none.
template <typename Enqueue>
int SubmitGroup(const char* call, int count, gradsync_handle** out, Enqueue enqueue) {
  if (count > 0 && out == nullptr) return Invalid(std::string(call) + ": handles is NULL");
  std::vector<gradsync_handle*> made;
  for (int i = 0; i < count; ++i) made.push_back(new gradsync_handle);
  const int rc = Guarded(call, [&] {
    std::vector<Handle> handles = enqueue(made);
    for (int i = 0; i < count; ++i) made[i]->handle = handles[i];
    return kOk;
  });
  for (int i = 0; i < count; ++i) {
    if (rc != GRADSYNC_OK) delete made[i];
    out[i] = rc == GRADSYNC_OK ? made[i] : nullptr;
  }
  return rc;
}

int GetInt(const char* call, int* out, int (*get)()) {
  if (int rc = CheckOut(out, call, "the output pointer")) return rc;
  return Guarded(call, [&] {
    *out = get();
    return kOk;
  });
}

// A value of process set `id` into *out.
template <typename Get>
int QuerySet(const char* call, int id, int* out, const char* what, Get get) {
  ProcessSet set;
  if (int rc = SetProcessSet(id, call, &set)) return rc;
  if (int rc = CheckOut(out, call, what)) return rc;
  return Guarded(call, [&] {
    *out = get(set);
    return kOk;
  });
}

// The reduction fields every reducing collective's options have.
template <typename Options>
int SetReduction(const char* call, int op, double prescale, double postscale, int process_set,
                 Options* options) {
  if (int rc = CheckOp(op, call)) return rc;
  if (int rc = SetProcessSet(process_set, call, &options->process_set)) return rc;
  options->op = static_cast<ReduceOp>(op);
  options->prescale = prescale;
  options->postscale = postscale;
  return kOk;
}

}  // namespace
}  // namespace gradsync

using namespace gradsync;

extern "C" {

const char* gradsync_last_error(void) { return t_last_error.c_str(); }

int gradsync_init(void) {
  return Guarded("gradsync_init", [] {
    init();
    return kOk;
  });
}

int gradsync_init_comm(int comm_fortran_handle) {
  return Guarded("gradsync_init_comm", [&] {
    int mpi_ready = 0;
    MPI_Initialized(&mpi_ready);
    if (!mpi_ready) {
      return Invalid(
          "gradsync_init_comm: MPI is not initialized; initialize it first, or call "
          "gradsync_init for MPI_COMM_WORLD");
    }
    const MPI_Comm comm = MPI_Comm_f2c(comm_fortran_handle);
    if (comm == MPI_COMM_NULL) return Invalid("gradsync_init_comm: the communicator is null");
    init(comm);
    return kOk;
  });
}

int gradsync_shutdown(void) {
  return Guarded("gradsync_shutdown", [] {
    shutdown();
    return kOk;
  });
}

int gradsync_is_initialized(int* initialized) {
  return GetInt("gradsync_is_initialized", initialized, [] { return is_initialized() ? 1 : 0; });
}
int gradsync_rank(int* out) {
  return GetInt("gradsync_rank", out, [] { return rank(); });
}
int gradsync_size(int* out) {
  return GetInt("gradsync_size", out, [] { return size(); });
}
int gradsync_local_rank(int* out) {
  return GetInt("gradsync_local_rank", out, [] { return local_rank(); });
}
int gradsync_local_size(int* out) {
  return GetInt("gradsync_local_size", out, [] { return local_size(); });
}
int gradsync_gpu_device(int* out) {
  return GetInt("gradsync_gpu_device", out, [] { return gpu_device(); });
}

int gradsync_allreduce_async(const char* name, void* data, int dtype, const int64_t* shape,
                             int ndim, int op, double prescale, double postscale, int process_set,
                             gradsync_handle** handle) {
  const char* call = "gradsync_allreduce_async";
  TensorView view;
  AllreduceOptions options;
  if (int rc = MakeView(call, data, dtype, shape, ndim, &view)) return rc;
  if (int rc = SetReduction(call, op, prescale, postscale, process_set, &options)) return rc;
  options.name = Name(name);
  return Submit(call, handle, [&](gradsync_handle* h) { h->handle = allreduce(view, options); });
}

int gradsync_allgather_async(const char* name, const void* data, int dtype, const int64_t* shape,
                             int ndim, int process_set, gradsync_handle** handle) {
  const char* call = "gradsync_allgather_async";
  TensorView view;
  AllgatherOptions options;
  if (int rc = MakeView(call, data, dtype, shape, ndim, &view)) return rc;
  if (int rc = SetProcessSet(process_set, call, &options.process_set)) return rc;
  options.name = Name(name);
  return Submit(call, handle,
                [&](gradsync_handle* h) { h->handle = allgather(view, IntoHandle(h), options); });
}

int gradsync_broadcast_async(const char* name, void* data, int dtype, const int64_t* shape,
                             int ndim, int root, int process_set, gradsync_handle** handle) {
  const char* call = "gradsync_broadcast_async";
  TensorView view;
  BroadcastOptions options;
  if (int rc = MakeView(call, data, dtype, shape, ndim, &view)) return rc;
  if (int rc = SetProcessSet(process_set, call, &options.process_set)) return rc;
  options.name = Name(name);
  return Submit(call, handle,
                [&](gradsync_handle* h) { h->handle = broadcast(view, root, options); });
}

int gradsync_alltoall_async(const char* name, const void* data, int dtype, const int64_t* shape,
                            int ndim, const int64_t* splits, int nsplits, int process_set,
                            gradsync_handle** handle) {
  const char* call = "gradsync_alltoall_async";
  TensorView view;
  AlltoallOptions options;
  if (int rc = MakeView(call, data, dtype, shape, ndim, &view)) return rc;
  if (int rc = SetProcessSet(process_set, call, &options.process_set)) return rc;
  if (nsplits < 0) return Invalid(std::string(call) + ": negative nsplits");
  if (nsplits > 0 && splits == nullptr) return Invalid(std::string(call) + ": splits is NULL");
  if (nsplits > 0) options.splits.assign(splits, splits + nsplits);
  options.name = Name(name);
  return Submit(call, handle,
                [&](gradsync_handle* h) { h->handle = alltoall(view, IntoHandle(h), options); });
}

int gradsync_reducescatter_async(const char* name, const void* data, int dtype,
                                 const int64_t* shape, int ndim, int op, double prescale,
                                 double postscale, int process_set, gradsync_handle** handle) {
  const char* call = "gradsync_reducescatter_async";
  TensorView view;
  ReducescatterOptions options;
  if (int rc = MakeView(call, data, dtype, shape, ndim, &view)) return rc;
  if (int rc = SetReduction(call, op, prescale, postscale, process_set, &options)) return rc;
  options.name = Name(name);
  return Submit(call, handle, [&](gradsync_handle* h) {
    h->handle = reducescatter(view, IntoHandle(h), options);
  });
}

int gradsync_grouped_allreduce_async(int count, const char* const* names, void* const* data,
                                     const int* dtypes, const int64_t* const* shapes,
                                     const int* ndims, int op, double prescale, double postscale,
                                     int process_set, gradsync_handle** handles) {
  const char* call = "gradsync_grouped_allreduce_async";
  std::vector<TensorView> views;
  GroupedAllreduceOptions options;
  if (int rc = MakeViews(call, count, const_cast<const void* const*>(data), dtypes, shapes, ndims,
                         &views)) {
    return rc;
  }
  if (int rc = SetReduction(call, op, prescale, postscale, process_set, &options)) return rc;
  options.names = Names(count, names);
  return SubmitGroup(call, count, handles, [&](const std::vector<gradsync_handle*>&) {
    return grouped_allreduce(views, options);
  });
}

int gradsync_grouped_allgather_async(int count, const char* const* names, const void* const* data,
                                     const int* dtypes, const int64_t* const* shapes,
                                     const int* ndims, int process_set, gradsync_handle** handles) {
  const char* call = "gradsync_grouped_allgather_async";
  std::vector<TensorView> views;
  GroupedAllgatherOptions options;
  if (int rc = MakeViews(call, count, data, dtypes, shapes, ndims, &views)) return rc;
  if (int rc = SetProcessSet(process_set, call, &options.process_set)) return rc;
  options.names = Names(count, names);
  return SubmitGroup(call, count, handles, [&](const std::vector<gradsync_handle*>& made) {
    std::vector<Allocator> allocators;
    for (gradsync_handle* h : made) allocators.push_back(IntoHandle(h));
    return grouped_allgather(views, std::move(allocators), options);
  });
}

int gradsync_grouped_reducescatter_async(int count, const char* const* names,
                                         const void* const* data, const int* dtypes,
                                         const int64_t* const* shapes, const int* ndims, int op,
                                         double prescale, double postscale, int process_set,
                                         gradsync_handle** handles) {
  const char* call = "gradsync_grouped_reducescatter_async";
  std::vector<TensorView> views;
  GroupedReducescatterOptions options;
  if (int rc = MakeViews(call, count, data, dtypes, shapes, ndims, &views)) return rc;
  if (int rc = SetReduction(call, op, prescale, postscale, process_set, &options)) return rc;
  options.names = Names(count, names);
  return SubmitGroup(call, count, handles, [&](const std::vector<gradsync_handle*>& made) {
    std::vector<Allocator> allocators;
    for (gradsync_handle* h : made) allocators.push_back(IntoHandle(h));
    return grouped_reducescatter(views, std::move(allocators), options);
  });
}

int gradsync_poll(gradsync_handle* handle, int* done) {
  if (int rc = CheckOut(handle, "gradsync_poll", "handle")) return rc;
  if (int rc = CheckOut(done, "gradsync_poll", "done")) return rc;
  *done = handle->handle.poll() ? 1 : 0;
  return kOk;
}

int gradsync_wait(gradsync_handle* handle) {
  if (int rc = CheckOut(handle, "gradsync_wait", "handle")) return rc;
  return Guarded("gradsync_wait", [&] {
    handle->handle.wait();
    if (!handle->finished) {
      handle->received_splits = handle->handle.received_splits();
      handle->finished = true;
    }
    return kOk;
  });
}

// A pending operation may still write into the handle (its output): wait for it first.
int gradsync_release(gradsync_handle* handle) {
  if (handle == nullptr) return kOk;
  int rc = GRADSYNC_OK;
  if (!handle->handle.poll()) {
    rc = Guarded("gradsync_release", [&] {
      try {
        handle->handle.wait();
      } catch (const Error&) {
        // The operation's own failure is not the release's.
      }
      return kOk;
    });
  }
  delete handle;
  return rc;
}

int gradsync_output(gradsync_handle* handle, const void** data, int* dtype, const int64_t** shape,
                    int* ndim) {
  const char* call = "gradsync_output";
  if (int rc = CheckOut(handle, call, "handle")) return rc;
  if (!handle->handle.poll()) {
    return Invalid("gradsync_output: the operation has not finished; wait for it first");
  }
  if (!handle->handle.status().ok()) return Fail(handle->handle.status());
  if (data != nullptr) *data = handle->output.empty() ? nullptr : handle->output.data();
  if (dtype != nullptr) *dtype = static_cast<int>(handle->output_dtype);
  if (shape != nullptr) *shape = handle->output_shape.data();
  if (ndim != nullptr) *ndim = static_cast<int>(handle->output_shape.size());
  return kOk;
}

int gradsync_received_splits(gradsync_handle* handle, const int64_t** splits, int* count) {
  const char* call = "gradsync_received_splits";
  if (int rc = CheckOut(handle, call, "handle")) return rc;
  if (int rc = CheckOut(splits, call, "splits")) return rc;
  if (int rc = CheckOut(count, call, "count")) return rc;
  if (!handle->handle.poll()) {
    return Invalid("gradsync_received_splits: the operation has not finished; wait for it first");
  }
  if (!handle->finished) {
    handle->received_splits = handle->handle.received_splits();
    handle->finished = true;
  }
  *splits = handle->received_splits.data();
  *count = static_cast<int>(handle->received_splits.size());
  return kOk;
}

int gradsync_add_process_set(const int* ranks, int count, int* process_set) {
  const char* call = "gradsync_add_process_set";
  if (count < 0) return Invalid(std::string(call) + ": negative count");
  if (count > 0 && ranks == nullptr) return Invalid(std::string(call) + ": ranks is NULL");
  if (int rc = CheckOut(process_set, call, "process_set")) return rc;
  return Guarded(call, [&] {
    *process_set = add_process_set(std::vector<int>(ranks, ranks + count)).id();
    return kOk;
  });
}

int gradsync_remove_process_set(int process_set) {
  const char* call = "gradsync_remove_process_set";
  ProcessSet set;
  if (int rc = SetProcessSet(process_set, call, &set)) return rc;
  return Guarded(call, [&] {
    remove_process_set(set);
    return kOk;
  });
}

int gradsync_process_set_rank(int process_set, int* rank) {
  return QuerySet("gradsync_process_set_rank", process_set, rank, "rank",
                  [](const ProcessSet& set) { return set.rank(); });
}

int gradsync_process_set_size(int process_set, int* size) {
  return QuerySet("gradsync_process_set_size", process_set, size, "size",
                  [](const ProcessSet& set) { return set.size(); });
}

int gradsync_join(int* last_rank) {
  return Guarded("gradsync_join", [&] {
    const int last = join();
    if (last_rank != nullptr) *last_rank = last;
    return kOk;
  });
}

int gradsync_barrier(int process_set) {
  const char* call = "gradsync_barrier";
  ProcessSet set;
  if (int rc = SetProcessSet(process_set, call, &set)) return rc;
  return Guarded(call, [&] {
    barrier("", set).wait();
    return kOk;
  });
}

int gradsync_start_timeline(const char* path) {
  if (int rc = CheckOut(path, "gradsync_start_timeline", "path")) return rc;
  return Guarded("gradsync_start_timeline", [&] {
    start_timeline(path);
    return kOk;
  });
}

int gradsync_stop_timeline(void) {
  return Guarded("gradsync_stop_timeline", [] {
    stop_timeline();
    return kOk;
  });
}

}  // extern "C"
