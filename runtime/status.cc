#include "gradsync/status.h"

namespace gradsync {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotInitialized:
      return "NotInitialized";
    case StatusCode::kMismatch:
      return "Mismatch";
    case StatusCode::kStalled:
      return "Stalled";
    case StatusCode::kShutdown:
      return "Shutdown";
    case StatusCode::kTimeout:
      return "Timeout";
    case StatusCode::kMpiError:
      return "MpiError";
    case StatusCode::kCudaError:
      return "CudaError";
    case StatusCode::kCorruptMessage:
      return "CorruptMessage";
    case StatusCode::kUnsupported:
      return "Unsupported";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

}  // namespace gradsync
