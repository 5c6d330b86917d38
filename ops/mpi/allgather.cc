#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/mpi/mpi_data_plane.h"
#include "runtime/mpi_context.h"
#include "runtime/timeline_activity.h"

namespace gradsync {
namespace {

// Byte counts and displacements for MPI_Allgatherv, whose int arguments cap each at INT_MAX.
struct GatherLayout {
  std::vector<int64_t> output_shape;
  std::vector<int> counts;
  std::vector<int> displs;
  int64_t total_bytes = 0;
};

Status CheckFirstDims(const std::vector<int64_t>& first_dims, int size, int rank,
                      int64_t own_first_dim) {
  if (first_dims.size() != static_cast<size_t>(size)) {
    return Status::InvalidArgument("got " + std::to_string(first_dims.size()) +
                                   " first dimensions for " + std::to_string(size) + " ranks");
  }
  for (int64_t d : first_dims) {
    if (d < 0) return Status::InvalidArgument("negative first dimension " + std::to_string(d));
  }
  if (first_dims[rank] != own_first_dim) {
    return Status::InvalidArgument("this rank's first dimension is " +
                                   std::to_string(own_first_dim) + " but the plan says " +
                                   std::to_string(first_dims[rank]));
  }
  return Status::OK();
}

Status PlanLayout(const TensorView& input, const std::vector<int64_t>& first_dims,
                  GatherLayout* layout) {
  // A scalar gathers like a one-element vector.
  std::vector<int64_t> shape = input.shape.empty() ? std::vector<int64_t>{1} : input.shape;
  const TensorView row(nullptr, input.dtype, std::vector<int64_t>(shape.begin() + 1, shape.end()));
  const int64_t row_bytes = row.num_bytes();
  if (row_bytes < 0) return Status::InvalidArgument("invalid shape " + ShapeString(input.shape));
  int64_t first_total = 0;
  for (size_t r = 0; r < first_dims.size(); ++r) {
    const int64_t d = first_dims[r];
    if (d > INT64_MAX - first_total) return Status::InvalidArgument("first dimensions overflow");
    if ((row_bytes > 0 && d > INT_MAX / row_bytes) || layout->total_bytes > INT_MAX) {
      return Status::Unsupported("rank " + std::to_string(r) + "'s part does not fit " +
                                 "MPI_Allgatherv's int byte counts and offsets (at most " +
                                 std::to_string(INT_MAX) + " bytes)");
    }
    layout->displs.push_back(static_cast<int>(layout->total_bytes));
    layout->counts.push_back(static_cast<int>(d * row_bytes));
    layout->total_bytes += d * row_bytes;
    first_total += d;
  }
  shape[0] = first_total;
  layout->output_shape = std::move(shape);
  return Status::OK();
}

}  // namespace

Status MpiDataPlane::Allgather(TensorEntry* entry, const std::vector<int64_t>& first_dims) {
  TimelineActivity activity(timeline_, entry, "MPI_ALLGATHER");
  const std::string what = "allgather of tensor '" + entry->name + "'";
  const TensorView& input = entry->input;
  if (input.device.kind != DeviceKind::kCpu) {
    return InContext(Status::InvalidArgument("tensor is on " + DeviceName(input.device) +
                                             "; the MPI data plane serves host memory only"),
                     what);
  }
  const int64_t own_first_dim = input.shape.empty() ? 1 : input.shape[0];
  GRADSYNC_RETURN_IF_ERROR(
      InContext(CheckFirstDims(first_dims, size_, rank_, own_first_dim), what));
  GatherLayout layout;
  GRADSYNC_RETURN_IF_ERROR(InContext(PlanLayout(input, first_dims, &layout), what));

  const Status allocated = AllocateOutput(entry, layout.output_shape);
  if (layout.total_bytes > 0) {
    // A failed allocation is local to this rank; the others are already in the collective, so
    // this rank still takes part, receiving into scratch memory, and fails afterwards.
    void* receive = allocated.ok() ? entry->output.data : fusion_buffer_.Get(layout.total_bytes);
    GRADSYNC_RETURN_IF_ERROR(InContext(
        MpiResult(MPI_Allgatherv(input.data, layout.counts[rank_], MPI_BYTE, receive,
                                 layout.counts.data(), layout.displs.data(), MPI_BYTE, comm_),
                  "MPI_Allgatherv"),
        what));
  }
  return InContext(allocated, what);
}

}  // namespace gradsync
