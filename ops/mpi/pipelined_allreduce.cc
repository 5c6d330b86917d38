// MpiDataPlane::AllreduceFusedPipelined: a fused bucket through MPI messages in chunks, so that
// copying the next chunk in (and the last one out) overlaps reducing the current one, instead of
// the copies adding to the reduction's time. At most two chunks are in flight: the one being
// reduced and the one being copied. MPI progresses a non-blocking collective only inside MPI
// calls, so the copies go in slices with an MPI_Test of the chunk in flight between them.
#include <algorithm>
#include <cstring>

#include "ops/mpi/entry_pieces.h"
#include "ops/mpi/mpi_data_plane.h"
#include "ops/scale.h"
#include "runtime/mpi_context.h"
#include "runtime/timeline_activity.h"

namespace gradsync {
namespace {

constexpr size_t kCopySlice = 256 << 10;  // bytes copied between two progress tests

// The byte ranges of a bucket's tensors within the fusion buffer, for copying part of it.
struct Layout {
  const std::vector<TensorEntry*>& entries;
  const std::vector<size_t>& offsets;
  const std::vector<int64_t>& counts;
  size_t elem_size;

  size_t End(size_t t) const { return offsets[t] + static_cast<size_t>(counts[t]) * elem_size; }
};

// Copies bytes [begin, end) of the bucket between the tensors and `buffer`: in (packing, with
// `scale` and zeros in the gaps) or out (unpacking, with `scale`). `first` is a tensor index at or
// before the range, advanced for the next call.
void CopyRange(const Layout& layout, char* buffer, size_t begin, size_t end, bool in, double scale,
               size_t* first) {
  size_t t = *first;
  while (t < layout.entries.size() && layout.End(t) <= begin) ++t;
  *first = t;
  size_t at = begin;
  for (; t < layout.entries.size() && at < end; ++t) {
    const size_t from = std::max(at, layout.offsets[t]);
    const size_t to = std::min(end, layout.End(t));
    if (in && from > at) std::memset(buffer + at, 0, std::min(from, end) - at);
    if (from >= to) {
      at = std::max(at, std::min(from, end));
      continue;
    }
    const auto inside = static_cast<int64_t>((from - layout.offsets[t]) / layout.elem_size);
    const auto count = static_cast<int64_t>((to - from) / layout.elem_size);
    if (in) {
      CopyEntryIn(*layout.entries[t], inside, count, scale, buffer + from);
    } else {
      CopyEntryOut(buffer + from, inside, count, scale, *layout.entries[t]);
    }
    at = to;
  }
  if (in && at < end) std::memset(buffer + at, 0, end - at);
}

}  // namespace

Status MpiDataPlane::AllreduceFusedPipelined(const std::vector<TensorEntry*>& entries,
                                             const ReduceSpec& spec,
                                             const std::vector<size_t>& offsets,
                                             const std::vector<int64_t>& counts, size_t total,
                                             MPI_Datatype type, MPI_Op op) {
  auto* buffer = static_cast<char*>(fusion_buffer_.Get(total));
  const Layout layout{entries, offsets, counts, DataTypeSize(spec.dtype)};
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
      CopyRange(layout, buffer, at, std::min(end, at + kCopySlice), in,
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
