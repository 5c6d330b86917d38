#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/mpi/mpi_data_plane.h"
#include "runtime/mpi_context.h"
#include "runtime/timeline_activity.h"

namespace gradsync {
namespace {

// Sent instead of a row count by a rank that cannot take part. Its first dimension and splits are
// known to it alone, so the count exchange is where the others learn of its failure and fail with
// it, rather than wait for it in MPI_Alltoallv.
constexpr int64_t kInvalidPart = -1;
constexpr int64_t kOversizedPart = -2;

// The rows exchanged with each rank, as byte counts and displacements for MPI_Alltoallv, whose int
// arguments cap each at INT_MAX.
struct ExchangeSide {
  std::vector<int64_t> rows;
  std::vector<int> counts;
  std::vector<int> displs;
  int64_t total_rows = 0;
  int64_t total_bytes = 0;
};

// Fills in the counts, displacements and totals of side->rows (none negative).
Status PlanSide(int64_t row_bytes, const char* toward, ExchangeSide* side) {
  side->counts.reserve(side->rows.size());
  side->displs.reserve(side->rows.size());
  for (size_t r = 0; r < side->rows.size(); ++r) {
    const int64_t n = side->rows[r];
    if (n > INT64_MAX - side->total_rows) {
      return Status::InvalidArgument("the rows " + std::string(toward) + " rank " +
                                     std::to_string(r) + " overflow the first dimension");
    }
    if (row_bytes > 0 && n > (INT_MAX - side->total_bytes) / row_bytes) {
      return Status::Unsupported("the rows " + std::string(toward) + " rank " + std::to_string(r) +
                                 " pass MPI_Alltoallv's int byte counts and offsets (at most " +
                                 std::to_string(INT_MAX) + " bytes in all)");
    }
    side->displs.push_back(static_cast<int>(side->total_bytes));
    side->counts.push_back(static_cast<int>(n * row_bytes));
    side->total_bytes += n * row_bytes;
    side->total_rows += n;
  }
  return Status::OK();
}

// The rows sent to each rank (given splits or EvenSplits) and the bytes of one row.
Status PlanSend(const TensorView& input, const std::vector<int64_t>& splits, int size,
                int64_t* row_bytes, ExchangeSide* send) {
  if (input.shape.empty()) {
    return Status::InvalidArgument("a scalar cannot be split; the input needs a dimension");
  }
  const TensorView row(nullptr, input.dtype,
                       std::vector<int64_t>(input.shape.begin() + 1, input.shape.end()));
  *row_bytes = row.num_bytes();
  if (input.num_bytes() < 0 || *row_bytes < 0) {
    return Status::InvalidArgument("invalid shape " + ShapeString(input.shape));
  }
  const int64_t rows = input.shape[0];
  if (splits.empty()) {
    send->rows = EvenSplits(rows, size);
  } else {
    GRADSYNC_RETURN_IF_ERROR(CheckSplits(splits, rows, size));
    send->rows = splits;
  }
  return PlanSide(*row_bytes, "sent to", send);
}

Status CheckPeers(const std::vector<int64_t>& received) {
  for (size_t r = 0; r < received.size(); ++r) {
    if (received[r] == kOversizedPart) {
      return Status::Unsupported("rank " + std::to_string(r) +
                                 "'s part does not fit MPI_Alltoallv's int byte counts (see that "
                                 "rank's error)");
    }
    if (received[r] < 0) {
      return Status::InvalidArgument("rank " + std::to_string(r) +
                                     " has an invalid input or splits (see that rank's error)");
    }
  }
  return Status::OK();
}

}  // namespace

Status MpiDataPlane::Alltoall(TensorEntry* entry) {
  TimelineActivity activity(timeline_, entry, "MPI_ALLTOALL");
  const std::string what = "alltoall of tensor '" + entry->name + "'";
  const TensorView& input = entry->input;
  // The device kind is negotiated, so every rank returns here together.
  if (input.device.kind != DeviceKind::kCpu) {
    return InContext(Status::InvalidArgument("tensor is on " + DeviceName(input.device) +
                                             "; the MPI data plane serves host memory only"),
                     what);
  }
  int64_t row_bytes = 0;
  ExchangeSide send;
  const Status local = PlanSend(input, entry->splits, size_, &row_bytes, &send);
  if (!local.ok()) {
    const bool oversized = local.code() == StatusCode::kUnsupported;
    send.rows.assign(static_cast<size_t>(size_), oversized ? kOversizedPart : kInvalidPart);
  }
  ExchangeSide receive;
  receive.rows.resize(static_cast<size_t>(size_));
  GRADSYNC_RETURN_IF_ERROR(
      InContext(MpiResult(MPI_Alltoall(send.rows.data(), 1, MPI_INT64_T, receive.rows.data(), 1,
                                       MPI_INT64_T, comm_),
                          "MPI_Alltoall"),
                what));
  GRADSYNC_RETURN_IF_ERROR(InContext(local, what));
  GRADSYNC_RETURN_IF_ERROR(InContext(CheckPeers(receive.rows), what));
  // Unlike the send side, this can fail on this rank alone (more than INT_MAX bytes arriving
  // here), which no other rank can tell from its counts: every rank learns whether all can take
  // what arrives before any enters MPI_Alltoallv, which would wait for this one for good.
  const Status received = PlanSide(row_bytes, "received from", &receive);
  int fits = received.ok() ? 1 : 0;
  int all_fit = 0;
  GRADSYNC_RETURN_IF_ERROR(InContext(
      MpiResult(MPI_Allreduce(&fits, &all_fit, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce"),
      what));
  GRADSYNC_RETURN_IF_ERROR(InContext(received, what));
  if (all_fit == 0) {
    return InContext(Status::Unsupported("another rank would receive more than MPI_Alltoallv's "
                                         "int byte counts allow (see that rank's error)"),
                     what);
  }

  std::vector<int64_t> shape = input.shape;
  shape[0] = receive.total_rows;
  const Status allocated = AllocateOutput(entry, shape);
  // A failed allocation is local to this rank, so it still takes part, receiving into scratch.
  void* output = allocated.ok()            ? entry->output.data
                 : receive.total_bytes > 0 ? fusion_buffer_.Get(receive.total_bytes)
                                           : nullptr;
  GRADSYNC_RETURN_IF_ERROR(InContext(
      MpiResult(MPI_Alltoallv(input.data, send.counts.data(), send.displs.data(), MPI_BYTE, output,
                              receive.counts.data(), receive.displs.data(), MPI_BYTE, comm_),
                "MPI_Alltoallv"),
      what));
  GRADSYNC_RETURN_IF_ERROR(InContext(allocated, what));
  if (entry->state) entry->state->received_splits = std::move(receive.rows);
  return Status::OK();
}

}  // namespace gradsync
