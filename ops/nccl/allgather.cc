#include <nccl.h>

#include "ops/cuda/cuda_status.h"
#include "ops/nccl/nccl_backend.h"

namespace gradsync {

// Equal counts are one ncclAllGather. Unequal ones (allgather with a variable first dimension) are
// a broadcast from every rank into its place in the output, in one NCCL group.
Status NcclBackend::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                               DataType dtype) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  GRADSYNC_RETURN_IF_ERROR(Enter());
  const auto type = static_cast<ncclDataType_t>(NcclDataTypeOf(dtype));
  const auto comm = static_cast<ncclComm_t>(comm_);
  const auto stream = static_cast<cudaStream_t>(cuda_stream());
  if (AllEqual(counts)) {
    if (counts.front() == 0) return Status::OK();
    GRADSYNC_NCCL_CALL(
        ncclAllGather(send, recv, static_cast<size_t>(counts.front()), type, comm, stream),
        device_);
    return Status::OK();
  }
  const size_t element = DataTypeSize(dtype);
  GRADSYNC_NCCL_CALL(ncclGroupStart(), device_);
  Status status;
  int64_t offset = 0;
  for (int r = 0; r < size_ && status.ok(); ++r) {
    char* place = static_cast<char*>(recv) + offset * static_cast<int64_t>(element);
    if (counts[r] > 0) {
      status = NcclResult(ncclBroadcast(r == rank_ ? send : place, place,
                                        static_cast<size_t>(counts[r]), type, r, comm, stream),
                          "ncclBroadcast", device_);
    }
    offset += counts[r];
  }
  const Status ended = NcclResult(ncclGroupEnd(), "ncclGroupEnd", device_);
  return status.ok() ? ended : status;
}

}  // namespace gradsync
