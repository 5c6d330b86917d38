// What the C API's sources share (c_api.cc, c_api_collectives.cc): the handle behind
// gradsync_handle, and how arguments are checked and exceptions become a code and the calling
// thread's message. Internal: not installed.
#pragma once

#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "gradsync/c_api.h"
#include "gradsync/gradsync.h"

struct gradsync_handle {
  gradsync::Handle handle;
  // The output of an allgather, reducescatter or alltoall, which gradsync allocates here.
  std::vector<unsigned char> output;
  std::vector<int64_t> output_shape;
  gradsync::DataType output_dtype = gradsync::DataType::kFloat32;
  std::vector<int64_t> received_splits;
  bool finished = false;             // output_shape and received_splits filled
  bool has_output = false;           // an allgather, reducescatter or alltoall (IntoHandle)
  bool has_received_splits = false;  // an alltoall
};

namespace gradsync {
namespace c_api {

constexpr int kMaxDims = 64;
// GRADSYNC_OK as an int, so that lambdas returning it and an error code deduce one type.
constexpr int kOk = GRADSYNC_OK;

// Sets the calling thread's message (gradsync_last_error) and returns `code` as an int.
int Fail(StatusCode code, const std::string& message);
int Fail(const Status& status);
// An InvalidArgument failure.
int Invalid(const std::string& message);
const std::string& LastError();

// The C-level checks; each returns GRADSYNC_OK or fails with InvalidArgument.
int CheckOut(const void* pointer, const char* call, const char* what);
int CheckDtype(int dtype, const char* call);
int CheckOp(int op, const char* call);
// A view of caller memory, after the C-level checks (the C++ API checks the rest).
int MakeView(const char* call, const void* data, int dtype, const int64_t* shape, int ndim,
             TensorView* view);
// The grouped forms' views, after checking every array.
int MakeViews(const char* call, int count, const void* const* data, const int* dtypes,
              const int64_t* const* shapes, const int* ndims, std::vector<TensorView>* views);
int SetProcessSet(int id, const char* call, ProcessSet* set);

// A C string as a name (NULL: empty, so that gradsync generates one).
std::string Name(const char* name);
std::vector<std::string> Names(int count, const char* const* names);
// The allocator of a collective that allocates its output: into the handle.
Allocator IntoHandle(gradsync_handle* h);
// A new handle for `handle`'s caller, or the failure.
int Allocated(gradsync_handle** out, const char* call);
int GetInt(const char* call, int* out, int (*get)());

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

// Grouped enqueues: `count` handles, all made or none.
template <typename Enqueue>
int SubmitGroup(const char* call, int count, gradsync_handle** out, Enqueue enqueue) {
  if (count > 0 && out == nullptr) return Invalid(std::string(call) + ": handles is NULL");
  // Owned here until every one is made and enqueued: none leaks when a later one fails.
  std::vector<std::unique_ptr<gradsync_handle>> made;
  const int rc = Guarded(call, [&] {
    std::vector<gradsync_handle*> handles_of;
    for (int i = 0; i < count; ++i) {
      made.push_back(std::make_unique<gradsync_handle>());
      handles_of.push_back(made.back().get());
    }
    std::vector<Handle> handles = enqueue(handles_of);
    for (int i = 0; i < count; ++i) made[i]->handle = handles[i];
    return kOk;
  });
  for (int i = 0; i < count; ++i) out[i] = rc == GRADSYNC_OK ? made[i].release() : nullptr;
  return rc;
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

}  // namespace c_api
}  // namespace gradsync
