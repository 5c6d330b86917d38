#include "ops/mpi/caller_allreduce.h"

#include <algorithm>
#include <string>

#include "ops/mpi/mpi_types.h"
#include "ops/scale.h"
#include "runtime/mpi_context.h"

namespace gradsync {

Status AllreduceOnLane(const HostSegment* pieces, size_t count, const LaneReduction& reduction,
                       bool flag, MPI_Comm comm, int64_t mpi_piece_bytes, const std::string& what,
                       std::vector<unsigned char>* staging, bool* flagged) {
  if (reduction.op != ReduceOp::kSum && reduction.op != ReduceOp::kAverage) {
    return Status::InvalidArgument(what + ": a lane reduces only with sum or average");
  }
  const size_t element = DataTypeSize(reduction.dtype);
  int64_t elements = 0;
  for (size_t i = 0; i < count; ++i) elements += pieces[i].elements;
  staging->resize((static_cast<size_t>(elements) + 1) * element);
  unsigned char* buffer = staging->data();
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    ScaledCopy(pieces[i].data, buffer + offset, pieces[i].elements, reduction.dtype,
               reduction.prescale);
    offset += static_cast<size_t>(pieces[i].elements) * element;
  }
  // One is the product's identity and zero the sum's: the flag element reads as 1 or 0.
  unsigned char* flag_element = buffer + offset;
  FillReductionIdentity(flag_element, 1, reduction.dtype,
                        flag ? ReduceOp::kProduct : ReduceOp::kSum);

  MPI_Op op = MPI_OP_NULL;
  Status status = MpiReduceOpOf(reduction.dtype, reduction.op, &op);
  if (status.ok()) {
    status = AllreduceInPieces(MPI_IN_PLACE, buffer, elements + 1, element,
                               MpiDatatypeOf(reduction.dtype), op, comm, mpi_piece_bytes);
  }
  if (!status.ok()) return Status(status.code(), what + ": " + status.message());
  // A sum of zeros is all zero bits in every dtype; any set flag makes it nonzero.
  *flagged = std::any_of(flag_element, flag_element + element,
                         [](unsigned char byte) { return byte != 0; });

  double postscale = reduction.postscale;
  if (reduction.op == ReduceOp::kAverage) {
    int size = 1;
    GRADSYNC_RETURN_IF_ERROR(MpiResult(MPI_Comm_size(comm, &size), "MPI_Comm_size"));
    postscale /= size;
  }
  offset = 0;
  for (size_t i = 0; i < count; ++i) {
    ScaledCopy(buffer + offset, pieces[i].data, pieces[i].elements, reduction.dtype, postscale);
    offset += static_cast<size_t>(pieces[i].elements) * element;
  }
  return Status::OK();
}

}  // namespace gradsync
