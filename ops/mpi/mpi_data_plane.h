// MpiDataPlane: host-memory collectives over MPI on gradsync's data communicator. Each collective
// lives in its own file (allreduce.cc, allgather.cc, broadcast.cc).
//
// Owns the host fusion buffer. Used by the background thread only.
#pragma once

#include <mpi.h>

#include "ops/data_plane.h"
#include "runtime/fusion_buffer.h"

namespace gradsync {

class MpiDataPlane : public DataPlane {
 public:
  explicit MpiDataPlane(MPI_Comm comm);

  Status Allreduce(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) override;
  Status Allgather(TensorEntry* entry, const std::vector<int64_t>& first_dims) override;
  Status Broadcast(TensorEntry* entry, int root) override;

 private:
  MPI_Comm comm_;
  int size_ = 1;
  FusionBuffer fusion_buffer_;
};

}  // namespace gradsync
