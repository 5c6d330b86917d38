// Status: the one error type below the bindings. A Status is either OK or carries a code and a
// message that says what failed, where (rank, tensor) and why. No exception crosses the core.
//
// Thread safety: a Status is a value; distinct objects may be used from any thread.
#pragma once

#include <string>
#include <utility>

namespace gradsync {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad input caught at enqueue time
  kNotInitialized = 2,   // call before init() or after shutdown()
  kMismatch = 3,         // ranks disagree on a collective's parameters
  kStalled = 4,          // the stall inspector gave up waiting for some ranks
  kShutdown = 5,         // the runtime was shut down while the operation was pending
  kTimeout = 6,          // a bounded wait ran out
  kMpiError = 7,         // an MPI call failed
  kCudaError = 8,        // a CUDA or NCCL call failed
  kCorruptMessage = 9,   // a peer's control message failed validation
  kUnsupported = 10,     // a valid request that this build cannot serve
  kInternal = 11,        // a bug in gradsync
};

const char* StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotInitialized(std::string m) {
    return {StatusCode::kNotInitialized, std::move(m)};
  }
  static Status Mismatch(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
  static Status Stalled(std::string m) { return {StatusCode::kStalled, std::move(m)}; }
  static Status Shutdown(std::string m) { return {StatusCode::kShutdown, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status MpiError(std::string m) { return {StatusCode::kMpiError, std::move(m)}; }
  static Status CorruptMessage(std::string m) {
    return {StatusCode::kCorruptMessage, std::move(m)};
  }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<CodeName>: <message>", or "OK".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace gradsync

// Returns from the enclosing function when `expr` yields a non-OK Status.
#define GRADSYNC_RETURN_IF_ERROR(expr)       \
  do {                                       \
    ::gradsync::Status _gs_status = (expr);  \
    if (!_gs_status.ok()) return _gs_status; \
  } while (0)
