#include "ops/mpi/mpi_data_plane.h"

namespace gradsync {

Status MpiDataPlane::Reducescatter(const std::vector<TensorEntry*>&, const ReduceSpec&) {
  return Status::Unsupported("reducescatter is not implemented yet");
}

}  // namespace gradsync
