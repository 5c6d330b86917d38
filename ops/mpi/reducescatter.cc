#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/mpi/mpi_data_plane.h"
#include "ops/mpi/mpi_types.h"
#include "ops/scale.h"
#include "runtime/mpi_context.h"
#include "runtime/timeline_activity.h"

namespace gradsync {
namespace {

std::string Describe(const TensorEntry& entry) {
  return "reducescatter of tensor '" + entry.name + "'";
}

// As for allreduce: negotiated properties fail with a Status on every rank together, while a
// broken local invariant aborts, since returning would leave the other ranks in the collective.
Status ValidateEntry(const TensorEntry& entry, const ReduceSpec& spec) {
  const TensorView& input = entry.input;
  if (input.dtype != spec.dtype) {
    return Status::InvalidArgument(Describe(entry) + ": dtype " + DataTypeName(input.dtype) +
                                   " differs from the bucket's " + DataTypeName(spec.dtype));
  }
  if (input.device.kind != DeviceKind::kCpu) {
    return Status::InvalidArgument(Describe(entry) + ": tensor is on " + DeviceName(input.device) +
                                   "; the MPI data plane serves host memory only");
  }
  if (input.shape.empty()) {
    return Status::InvalidArgument(Describe(entry) +
                                   ": a scalar cannot be scattered; the input needs a dimension");
  }
  const int64_t bytes = input.num_bytes();
  if (bytes < 0) {
    return Status::InvalidArgument(Describe(entry) + ": invalid shape " + ShapeString(input.shape));
  }
  if (bytes > 0 && input.data == nullptr) {
    std::fprintf(stderr, "gradsync: internal error: %s: no input buffer\n",
                 Describe(entry).c_str());
    std::abort();
  }
  return Status::OK();
}

// How one entry's first dimension is divided: rows[r] rows of row_elements elements go to rank r.
struct ScatterPart {
  std::vector<int64_t> rows;
  int64_t row_elements = 0;
};

// Rank r's block of the packed input holds rank r's rows of every entry, in entry order, so one
// MPI_Reduce_scatter with counts[r] elements for rank r serves the whole bucket.
struct ScatterLayout {
  std::vector<ScatterPart> parts;
  std::vector<int> counts;
  int64_t total = 0;
};

Status PlanLayout(const std::vector<TensorEntry*>& entries, int size, ScatterLayout* layout) {
  layout->parts.reserve(entries.size());
  layout->counts.assign(static_cast<size_t>(size), 0);
  for (const TensorEntry* entry : entries) {
    const TensorView& input = entry->input;
    const TensorView row(nullptr, input.dtype,
                         std::vector<int64_t>(input.shape.begin() + 1, input.shape.end()));
    ScatterPart part;
    part.row_elements = row.num_elements();
    // With zero rows the whole tensor is empty however large a row would be.
    if (part.row_elements < 0) {
      return Status::InvalidArgument("tensor '" + entry->name + "' has an invalid shape " +
                                     ShapeString(input.shape));
    }
    part.rows = EvenSplits(input.shape[0], size);
    for (int r = 0; r < size; ++r) {
      // Within the entry's element count, which ValidateEntry found to fit an int64.
      const int64_t n = part.rows[r] * part.row_elements;
      // MPI implementations add up the counts in an int, so the total is held to INT_MAX too.
      if (n > INT_MAX - layout->total) {
        return Status::Unsupported("the bucket holds more than " + std::to_string(INT_MAX) +
                                   " elements, beyond MPI_Reduce_scatter's int counts");
      }
      layout->counts[r] += static_cast<int>(n);
      layout->total += n;
    }
    layout->parts.push_back(std::move(part));
  }
  return Status::OK();
}

// Copies every entry's rows into its rank's block of `buffer`, scaled by `prescale`.
void Pack(const std::vector<TensorEntry*>& entries, const ScatterLayout& layout, DataType dtype,
          double prescale, char* buffer) {
  const size_t elem_size = DataTypeSize(dtype);
  // The row of each entry where the next rank's rows start.
  std::vector<int64_t> next_row(entries.size(), 0);
  char* out = buffer;
  for (size_t r = 0; r < layout.counts.size(); ++r) {
    for (size_t i = 0; i < entries.size(); ++i) {
      const ScatterPart& part = layout.parts[i];
      const int64_t n = part.rows[r] * part.row_elements;
      if (n == 0) continue;
      const auto* in = static_cast<const char*>(entries[i]->input.data) +
                       static_cast<size_t>(next_row[i] * part.row_elements) * elem_size;
      ScaledCopy(in, out, n, dtype, prescale);
      out += static_cast<size_t>(n) * elem_size;
      next_row[i] += part.rows[r];
    }
  }
}

// Copies this rank's reduced block into the outputs of the entries that have one, scaled by
// `postscale`.
void Unpack(const char* block, const ScatterLayout& layout, int rank, DataType dtype,
            double postscale, const std::vector<TensorEntry*>& entries,
            const std::vector<bool>& allocated) {
  const size_t elem_size = DataTypeSize(dtype);
  for (size_t i = 0; i < entries.size(); ++i) {
    const ScatterPart& part = layout.parts[i];
    const int64_t n = part.rows[rank] * part.row_elements;
    if (n == 0) continue;
    if (allocated[i]) ScaledCopy(block, entries[i]->output.data, n, dtype, postscale);
    block += static_cast<size_t>(n) * elem_size;
  }
}

}  // namespace

Status MpiDataPlane::Reducescatter(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                                   std::vector<LocalFailure>* local_failures) {
  if (entries.empty()) return Status::OK();
  for (const TensorEntry* entry : entries) GRADSYNC_RETURN_IF_ERROR(ValidateEntry(*entry, spec));
  MPI_Op op = MPI_OP_NULL;
  Status status = MpiReduceOpOf(spec.dtype, spec.op, &op);
  ScatterLayout layout;
  if (status.ok()) status = PlanLayout(entries, size_, &layout);
  if (!status.ok()) return InContext(status, DescribeBucket("reducescatter", entries));

  // Every output is allocated before the collective, so that a single entry can receive its
  // share directly. An allocation failure is this rank's alone: the entry still sends its input,
  // receives into scratch, and fails by itself once this rank has taken part.
  std::vector<bool> allocated(entries.size(), true);
  size_t failures = 0;
  std::vector<int64_t> shape;
  for (size_t i = 0; i < entries.size(); ++i) {
    shape = entries[i]->input.shape;
    shape[0] = layout.parts[i].rows[rank_];
    const Status s = AllocateOutput(entries[i], shape);
    if (s.ok()) continue;
    allocated[i] = false;
    ++failures;
    local_failures->push_back({entries[i], InContext(s, Describe(*entries[i]))});
  }
  // Every rank holds the same shapes, so every rank skips together.
  if (layout.total == 0) return Status::OK();

  ReduceSpec effective = spec;
  if (spec.op == ReduceOp::kAverage) effective.postscale *= 1.0 / size_;
  const size_t elem_size = DataTypeSize(spec.dtype);
  // A single entry's input is its own packed layout: it is sent as it is unless prescaled, and
  // its share is received straight into its output.
  const bool single = entries.size() == 1;
  const bool pack = !single || effective.prescale != 1.0;
  const bool receive_in_buffer = !single || failures > 0;
  const size_t send_bytes =
      pack ? AlignFusionOffset(static_cast<size_t>(layout.total) * elem_size) : 0;
  const size_t receive_bytes =
      receive_in_buffer ? static_cast<size_t>(layout.counts[rank_]) * elem_size : 0;
  char* buffer = send_bytes + receive_bytes > 0
                     ? static_cast<char*>(fusion_buffer_.Get(send_bytes + receive_bytes))
                     : nullptr;
  if (pack) {
    TimelineActivity activity(timeline_, entries, "MEMCPY_IN_FUSION_BUFFER");
    Pack(entries, layout, spec.dtype, effective.prescale, buffer);
  }
  const void* send = pack ? buffer : entries[0]->input.data;
  void* receive = receive_in_buffer ? buffer + send_bytes : entries[0]->output.data;
  {
    TimelineActivity activity(timeline_, entries, "MPI_REDUCESCATTER");
    GRADSYNC_RETURN_IF_ERROR(
        InContext(MpiResult(MPI_Reduce_scatter(send, receive, layout.counts.data(),
                                               MpiDatatypeOf(spec.dtype), op, comm_),
                            "MPI_Reduce_scatter"),
                  DescribeBucket("reducescatter", entries)));
  }
  if (failures == entries.size()) return Status::OK();

  if (single) {
    ScaledCopy(receive, receive, layout.counts[rank_], spec.dtype, effective.postscale);
  } else {
    TimelineActivity activity(timeline_, entries, "MEMCPY_OUT_FUSION_BUFFER");
    Unpack(static_cast<const char*>(receive), layout, rank_, spec.dtype, effective.postscale,
           entries, allocated);
  }
  return Status::OK();
}

}  // namespace gradsync
