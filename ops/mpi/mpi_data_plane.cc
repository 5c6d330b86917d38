#include "ops/mpi/mpi_data_plane.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

// The constructor cannot return a Status, and a communicator whose size cannot be read is a
// broken invariant of the caller, so it aborts.
int CommAttributeOrDie(int (*query)(MPI_Comm, int*), MPI_Comm comm, const char* call) {
  int value = 0;
  const Status status = MpiResult(query(comm, &value), call);
  if (!status.ok()) {
    std::fprintf(stderr, "gradsync: MpiDataPlane: %s\n", status.ToString().c_str());
    std::abort();
  }
  return value;
}

}  // namespace

MpiDataPlane::MpiDataPlane(MPI_Comm comm, Timeline* timeline, int64_t shm_threshold_bytes,
                           bool hierarchical_allreduce)
    : comm_(comm),
      size_(CommAttributeOrDie(MPI_Comm_size, comm, "MPI_Comm_size")),
      rank_(CommAttributeOrDie(MPI_Comm_rank, comm, "MPI_Comm_rank")),
      shared_memory_(comm, shm_threshold_bytes, kSharedMemoryMaxRanks),
      hierarchical_(comm, hierarchical_allreduce, shm_threshold_bytes),
      timeline_(timeline) {}

Status MpiDataPlane::InContext(const Status& status, const std::string& what) {
  if (status.ok()) return status;
  return Status(status.code(), what + ": " + status.message());
}

Status MpiDataPlane::AllocateOutput(TensorEntry* entry, const std::vector<int64_t>& shape) {
  std::string thrown;
  void* data = AllocateOutputMemory(*entry, shape, &thrown);
  TensorView output(data, entry->input.dtype, shape, entry->input.device);
  // An empty output needs no memory, and frameworks hand out nullptr for empty tensors.
  if (data == nullptr && output.num_bytes() != 0) return NoOutputMemory(shape, thrown);
  entry->output = std::move(output);
  if (entry->state) entry->state->output_shape = shape;
  return Status::OK();
}

}  // namespace gradsync
