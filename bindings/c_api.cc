// The C API (<gradsync/c_api.h>) over the C++ one: arguments checked here, every exception caught
// and turned into a code and the calling thread's message. Lifecycle, queries, handles and process
// sets here; the collectives in c_api_collectives.cc.
#include <mpi.h>

#include "bindings/c_api_support.h"
#include "bindings/runtime.h"

using namespace gradsync;
using namespace gradsync::c_api;

extern "C" {

const char* gradsync_last_error(void) { return LastError().c_str(); }

int gradsync_init(void) {
  return Guarded("gradsync_init", [] {
    init();
    return kOk;
  });
}

int gradsync_init_comm(int comm_fortran_handle) {
  return Guarded("gradsync_init_comm", [&] {
    int mpi_ready = 0, finalized = 0;
    MPI_Initialized(&mpi_ready);
    MPI_Finalized(&finalized);
    if (finalized) {
      return Invalid("gradsync_init_comm: MPI has been finalized; it cannot be used again");
    }
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
  // Waited on whether or not it is done, so that a release counts as one wait wherever the
  // program releases, whatever the timing (the locked schedule cuts its buckets at waits).
  const int rc = Guarded("gradsync_release", [&] {
    try {
      handle->handle.wait();
    } catch (const Error&) {
      // The operation's own failure is not the release's.
    }
    return kOk;
  });
  delete handle;
  return rc;
}

int gradsync_output(gradsync_handle* handle, const void** data, int* dtype, const int64_t** shape,
                    int* ndim) {
  const char* call = "gradsync_output";
  if (int rc = CheckOut(handle, call, "handle")) return rc;
  if (!handle->has_output) {
    return Invalid("gradsync_output: only an allgather, reducescatter or alltoall has an output");
  }
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
  if (!handle->has_received_splits) {
    return Invalid("gradsync_received_splits: only an alltoall has received splits");
  }
  if (!handle->handle.poll()) {
    return Invalid("gradsync_received_splits: the operation has not finished; wait for it first");
  }
  if (!handle->handle.status().ok()) return Fail(handle->handle.status());
  return Guarded(call, [&] {
    if (!handle->finished) {
      handle->received_splits = handle->handle.received_splits();
      handle->finished = true;
    }
    *splits = handle->received_splits.data();
    *count = static_cast<int>(handle->received_splits.size());
    return kOk;
  });
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
