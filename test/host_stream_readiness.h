// Producer readiness without a GPU: a HostStream's address stands in for a cudaStream_t, and
// recording on it records a host event (install with SetReadinessRecorderForTesting).
#pragma once

#include <memory>

#include "gradsync/status.h"
#include "runtime/host_stream.h"
#include "runtime/stream.h"

namespace gradsync {
namespace testing {

inline Status RecordOnHostStream(void* stream, int /*device*/,
                                 std::shared_ptr<StreamEvent>* ready) {
  *ready = static_cast<HostStream*>(stream)->Record();
  return Status::OK();
}

}  // namespace testing
}  // namespace gradsync
