#include "bindings/c_api_support.h"

#include "bindings/runtime.h"

namespace gradsync {
namespace c_api {

namespace {
thread_local std::string t_last_error;
}  // namespace

const std::string& LastError() { return t_last_error; }

int Fail(StatusCode code, const std::string& message) {
  t_last_error = message;
  return static_cast<int>(code);
}

int Fail(const Status& status) { return Fail(status.code(), status.ToString()); }

int Invalid(const std::string& message) {
  return Fail(StatusCode::kInvalidArgument, "InvalidArgument: " + message);
}

int CheckOut(const void* pointer, const char* call, const char* what) {
  if (pointer != nullptr) return kOk;
  return Invalid(std::string(call) + ": " + what + " is NULL");
}

int CheckDtype(int dtype, const char* call) {
  if (dtype >= 0 && dtype < kNumDataTypes) return kOk;
  return Invalid(std::string(call) + ": unknown dtype " + std::to_string(dtype));
}

// The C enum names the C++ values; the last one shows that none was left out.
static_assert(GRADSYNC_ADASUM == static_cast<int>(ReduceOp::kAdasum) &&
                  GRADSYNC_ADASUM + 1 == kNumReduceOps,
              "c_api.h's reduce ops differ from ReduceOp");

int CheckOp(int op, const char* call) {
  if (op >= 0 && op < kNumReduceOps) return kOk;
  return Invalid(std::string(call) + ": unknown reduce op " + std::to_string(op));
}

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

Allocator IntoHandle(gradsync_handle* h) {
  h->has_output = true;
  return [h](const std::vector<int64_t>& shape, DataType dtype) -> void* {
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;
    h->output.resize(static_cast<size_t>(elements) * DataTypeSize(dtype));
    h->output_shape = shape;
    h->output_dtype = dtype;
    return h->output.empty() ? nullptr : h->output.data();
  };
}

int Allocated(gradsync_handle** out, const char* call) {
  if (int rc = CheckOut(out, call, "handle")) return rc;
  *out = new (std::nothrow) gradsync_handle;
  return *out != nullptr ? kOk : Fail(StatusCode::kInternal, std::string(call) + ": out of memory");
}

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

int GetInt(const char* call, int* out, int (*get)()) {
  if (int rc = CheckOut(out, call, "the output pointer")) return rc;
  return Guarded(call, [&] {
    *out = get();
    return kOk;
  });
}

}  // namespace c_api
}  // namespace gradsync
