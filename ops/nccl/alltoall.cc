#include <nccl.h>

#include "ops/cuda/cuda_status.h"
#include "ops/nccl/nccl_backend.h"

namespace gradsync {

// Point to point in one NCCL group: a send and a receive per peer.
Status NcclBackend::Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                              const std::vector<int64_t>& recv_counts, DataType dtype) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  GRADSYNC_RETURN_IF_ERROR(Enter());
  const auto type = static_cast<ncclDataType_t>(NcclDataTypeOf(dtype));
  const auto comm = static_cast<ncclComm_t>(comm_);
  const auto stream = static_cast<cudaStream_t>(cuda_stream());
  const auto element = static_cast<int64_t>(DataTypeSize(dtype));
  GRADSYNC_NCCL_CALL(ncclGroupStart(), device_);
  Status status;
  int64_t sent = 0;
  int64_t received = 0;
  for (int r = 0; r < size_ && status.ok(); ++r) {
    if (send_counts[r] > 0) {
      status = NcclResult(ncclSend(static_cast<const char*>(send) + sent * element,
                                   static_cast<size_t>(send_counts[r]), type, r, comm, stream),
                          "ncclSend", device_);
    }
    if (status.ok() && recv_counts[r] > 0) {
      status = NcclResult(ncclRecv(static_cast<char*>(recv) + received * element,
                                   static_cast<size_t>(recv_counts[r]), type, r, comm, stream),
                          "ncclRecv", device_);
    }
    sent += send_counts[r];
    received += recv_counts[r];
  }
  const Status ended = NcclResult(ncclGroupEnd(), "ncclGroupEnd", device_);
  return status.ok() ? ended : status;
}

}  // namespace gradsync
