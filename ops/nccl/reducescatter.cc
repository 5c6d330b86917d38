#include <nccl.h>

#include "ops/cuda/cuda_status.h"
#include "ops/nccl/nccl_backend.h"

namespace gradsync {

// Equal shares are one ncclReduceScatter. Unequal ones (rows that do not divide evenly) are a
// reduce to each rank of its share, in one NCCL group.
Status NcclBackend::ReduceScatterv(const void* send, void* recv, const std::vector<int64_t>& counts,
                                   DataType dtype, ReduceOp op) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  GRADSYNC_RETURN_IF_ERROR(Enter());
  const auto type = static_cast<ncclDataType_t>(NcclDataTypeOf(dtype));
  const auto red = static_cast<ncclRedOp_t>(NcclRedOpOf(op));
  const auto comm = static_cast<ncclComm_t>(comm_);
  const auto stream = static_cast<cudaStream_t>(cuda_stream());
  if (AllEqual(counts)) {
    if (counts.front() == 0) return Status::OK();
    GRADSYNC_NCCL_CALL(
        ncclReduceScatter(send, recv, static_cast<size_t>(counts.front()), type, red, comm, stream),
        device_);
    return Status::OK();
  }
  const auto element = static_cast<int64_t>(DataTypeSize(dtype));
  GRADSYNC_NCCL_CALL(ncclGroupStart(), device_);
  Status status;
  int64_t offset = 0;
  for (int r = 0; r < size_ && status.ok(); ++r) {
    if (counts[r] > 0) {
      status = NcclResult(
          ncclReduce(static_cast<const char*>(send) + offset * element, r == rank_ ? recv : nullptr,
                     static_cast<size_t>(counts[r]), type, red, r, comm, stream),
          "ncclReduce", device_);
    }
    offset += counts[r];
  }
  const Status ended = NcclResult(ncclGroupEnd(), "ncclGroupEnd", device_);
  return status.ok() ? ended : status;
}

}  // namespace gradsync
