#include "ops/mpi/shared_memory_allreduce.h"

#include <algorithm>
#include <vector>

#include "ops/mpi/mpi_types.h"
#include "ops/scale.h"

namespace gradsync {

ElementRange SliceOf(int64_t count, size_t elem_size, int parts, int part) {
  // Every element size divides 64, so slices are cut in whole 64-byte units.
  const int64_t unit = std::max<int64_t>(1, 64 / static_cast<int64_t>(elem_size));
  const int64_t units = (count + unit - 1) / unit;
  auto boundary = [&](int p) { return std::min(count, units * p / parts * unit); };
  return ElementRange{boundary(part), part + 1 == parts ? count : boundary(part + 1)};
}

Status ReduceSlicesThroughSharedMemory(NodeSharedMemory* memory, int rank, int size, int64_t count,
                                       const SliceReduction& how) {
  const size_t elem_size = DataTypeSize(how.dtype);
  const ElementRange mine = SliceOf(count, elem_size, size, rank);
  const size_t offset = static_cast<size_t>(mine.begin) * elem_size;
  const bool across_hosts = how.cross != MPI_COMM_NULL;
  GRADSYNC_RETURN_IF_ERROR(memory->Barrier());
  std::vector<const void*> inputs(static_cast<size_t>(size));
  for (int q = 0; q < size; ++q) inputs[static_cast<size_t>(q)] = memory->Region(q) + offset;
  char* result = memory->Result() + offset;
  CombineInto(inputs.data(), size, result, mine.size(), how.dtype, how.op,
              across_hosts ? 1.0 : how.postscale);
  if (across_hosts) {
    GRADSYNC_RETURN_IF_ERROR(AllreduceInPieces(
        MPI_IN_PLACE, result, mine.size(), elem_size, how.mpi_type, how.mpi_op, how.cross,
        how.piece_bytes, ScalingHooks(result, result, how.dtype, 1.0, how.postscale)));
  }
  return memory->Barrier();
}

}  // namespace gradsync
