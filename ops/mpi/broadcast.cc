#include <algorithm>
#include <climits>
#include <string>

#include "ops/mpi/mpi_data_plane.h"
#include "runtime/mpi_context.h"
#include "runtime/timeline_activity.h"

namespace gradsync {

Status MpiDataPlane::Broadcast(TensorEntry* entry, int root) {
  TimelineActivity activity(timeline_, entry, "MPI_BCAST");
  const std::string what = "broadcast of tensor '" + entry->name + "'";
  const TensorView& input = entry->input;
  if (root < 0 || root >= size_) {
    return InContext(
        Status::InvalidArgument("root " + std::to_string(root) + " is not a rank of this " +
                                std::to_string(size_) + "-rank communicator"),
        what);
  }
  if (input.device.kind != DeviceKind::kCpu) {
    return InContext(Status::InvalidArgument("tensor is on " + DeviceName(input.device) +
                                             "; the MPI data plane serves host memory only"),
                     what);
  }
  const int64_t bytes = input.num_bytes();
  if (bytes < 0) {
    return InContext(Status::InvalidArgument("invalid shape " + ShapeString(input.shape)), what);
  }
  // Bytes, not elements, so one path serves every dtype; pieces keep each count within an int.
  auto* data = static_cast<char*>(input.data);
  for (int64_t done = 0; done < bytes;) {
    const int piece = static_cast<int>(std::min<int64_t>(bytes - done, INT_MAX));
    GRADSYNC_RETURN_IF_ERROR(InContext(
        MpiResult(MPI_Bcast(data + done, piece, MPI_BYTE, root, comm_), "MPI_Bcast"), what));
    done += piece;
  }
  return Status::OK();
}

}  // namespace gradsync
