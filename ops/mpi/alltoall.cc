#include "ops/mpi/mpi_data_plane.h"

namespace gradsync {

Status MpiDataPlane::Alltoall(TensorEntry*) {
  return Status::Unsupported("alltoall is not implemented yet");
}

}  // namespace gradsync
