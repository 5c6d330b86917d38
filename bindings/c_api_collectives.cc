// The C API's collectives (<gradsync/c_api.h>): each checks its arguments, enqueues through the
// C++ API and returns a handle, or a code and the calling thread's message.
#include "bindings/c_api_support.h"

using namespace gradsync;
using namespace gradsync::c_api;

extern "C" {

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
  return Submit(call, handle, [&](gradsync_handle* h) {
    h->has_received_splits = true;
    h->handle = alltoall(view, IntoHandle(h), options);
  });
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

}  // extern "C"
