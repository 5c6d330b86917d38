// MpiDataPlane::AllreduceFusedPipelined: a fused bucket through MPI messages in chunks, so that
// copying the next chunk in (and the last one out) overlaps reducing the current one, instead of
// the copies adding to the reduction's time. At most two chunks are in flight: the one being
// reduced and the one being copied. MPI progresses a non-blocking collective only inside MPI
// calls, so the copies go in slices with an MPI_Test of the chunk in flight between them.
#include <algorithm>

#include "ops/mpi/entry_pieces.h"
#include "ops/mpi/mpi_data_plane.h"
#include "runtime/mpi_context.h"
#include "runtime/timeline_activity.h"

namespace gradsync {
namespace {

constexpr size_t kCopySlice = 256 << 10;  // bytes copied between two progress tests

}  // namespace

Status MpiDataPlane::AllreduceFusedPipelined(const std::vector<TensorEntry*>& entries,
                                             const ReduceSpec& spec,
                                             const std::vector<size_t>& offsets,
                                             const std::vector<int64_t>& counts, size_t total,
                                             MPI_Datatype type, MPI_Op op) {
  auto* buffer = static_cast<char*>(fusion_buffer_.Get(total));
  const FusedLayout layout{entries, offsets, counts, DataTypeSize(spec.dtype)};
  const size_t chunk = static_cast<size_t>(pipeline_chunk_bytes_);
  const size_t chunks = (total + chunk - 1) / chunk;
  TimelineActivity activity(timeline_, entries, "MPI_ALLREDUCE_PIPELINED");

  // `reducing` is the chunk whose allreduce runs; `testing` the request progressed between slices.
  MPI_Request reducing = MPI_REQUEST_NULL;
  size_t reducing_chunk = 0;
  MPI_Request* testing = &reducing;
  Status status;
  const auto copy = [&](size_t begin, size_t end, bool in, size_t* cursor) {
    for (size_t at = begin; at < end; at += kCopySlice) {
      CopyFusedRange(layout, buffer, at, std::min(end, at + kCopySlice), in,
                     in ? spec.prescale : spec.postscale, cursor);
      if (testing != nullptr && *testing != MPI_REQUEST_NULL && status.ok()) {
        int done = 0;
        status = MpiResult(MPI_Test(testing, &done, MPI_STATUS_IGNORE), "MPI_Test");
      }
    }
  };
  // Waits for the chunk `reducing` and copies it out while `next` (may be null) reduces.
  size_t in_cursor = 0, out_cursor = 0;
  const auto drain = [&](MPI_Request* next) {
    const Status waited = MpiResult(MPI_Wait(&reducing, MPI_STATUS_IGNORE), "MPI_Wait");
    if (status.ok()) status = waited;
    if (!status.ok()) return;
    testing = next;
    const size_t begin = reducing_chunk * chunk;
    copy(begin, std::min(total, begin + chunk), false, &out_cursor);
    testing = &reducing;
  };

  for (size_t c = 0; c < chunks && status.ok(); ++c) {
    const size_t begin = c * chunk, end = std::min(total, begin + chunk);
    copy(begin, end, true, &in_cursor);  // overlaps the previous chunk's reduction
    if (!status.ok()) break;
    MPI_Request next = MPI_REQUEST_NULL;
    status = MpiResult(
        MPI_Iallreduce(MPI_IN_PLACE, buffer + begin,
                       static_cast<int>((end - begin) / layout.elem_size), type, op, comm_, &next),
        "MPI_Iallreduce");
    if (c > 0 && status.ok()) drain(&next);  // the previous chunk out, while this one reduces
    if (next != MPI_REQUEST_NULL && !status.ok()) MPI_Wait(&next, MPI_STATUS_IGNORE);
    if (!status.ok()) break;
    reducing = next;
    reducing_chunk = c;
  }
  if (status.ok()) drain(nullptr);
  if (reducing != MPI_REQUEST_NULL) MPI_Wait(&reducing, MPI_STATUS_IGNORE);  // after a failure
  return status;
}

}  // namespace gradsync
