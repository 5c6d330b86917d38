#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/mpi/entry_pieces.h"
#include "ops/mpi/mpi_data_plane.h"
#include "ops/mpi/mpi_types.h"
#include "ops/mpi/shared_memory_allreduce.h"
#include "ops/scale.h"
#include "runtime/mpi_context.h"
#include "runtime/timeline_activity.h"

namespace gradsync {
namespace {

// Only negotiated properties are checked with a Status: they are equal on every rank, so every
// rank fails the bucket together. A broken local invariant (a buffer the enqueue check should have
// refused) would leave the other ranks waiting in the collective, so it aborts instead.
Status ValidateEntry(const TensorEntry& entry, const ReduceSpec& spec) {
  // Strings are built only on failure: this runs for every tensor of every bucket.
  auto where = [&] { return "allreduce of tensor '" + entry.name + "': "; };
  if (entry.input.dtype != spec.dtype) {
    return Status::InvalidArgument(where() + "dtype " + DataTypeName(entry.input.dtype) +
                                   " differs from the bucket's " + DataTypeName(spec.dtype));
  }
  if (entry.input.device.kind != DeviceKind::kCpu) {
    return Status::InvalidArgument(where() + "tensor is on " + DeviceName(entry.input.device) +
                                   "; the MPI data plane serves host memory only");
  }
  const int64_t n = entry.input.num_bytes();
  if (n < 0) {
    return Status::InvalidArgument(where() + "invalid shape " + ShapeString(entry.input.shape));
  }
  // The output's shape was checked against the input's at enqueue (and a stand-in's is a copy);
  // reading it again would cost a cache miss per tensor.
  const bool output_fits = entry.output.dtype == spec.dtype;
  const bool has_memory =
      entry.segments != nullptr || (entry.input.data != nullptr && entry.output.data != nullptr);
  if (!output_fits || (n > 0 && !has_memory)) {
    std::fprintf(stderr, "gradsync: internal error: %sbroken input/output buffers\n",
                 where().c_str());
    std::abort();
  }
  return Status::OK();
}

}  // namespace

Status MpiDataPlane::Allreduce(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) {
  last_allreduce_shared_ = false;
  if (entries.empty()) return Status::OK();
  for (const TensorEntry* entry : entries) GRADSYNC_RETURN_IF_ERROR(ValidateEntry(*entry, spec));
  if (spec.op == ReduceOp::kAdasum) {
    const Status status = AllreduceAdasum(entries, spec);
    return status.ok() ? status : InContext(status, DescribeBucket("allreduce", entries));
  }
  MPI_Op op = MPI_OP_NULL;
  Status status = MpiReduceOpOf(spec.dtype, spec.op, &op);
  const MPI_Datatype type = MpiDatatypeOf(spec.dtype);

  ReduceSpec effective = spec;
  if (spec.op == ReduceOp::kAverage) effective.postscale *= 1.0 / size_;
  if (status.ok()) {
    status = entries.size() == 1 ? AllreduceOne(entries[0], effective, type, op)
                                 : AllreduceFused(entries, effective, type, op);
  }
  return status.ok() ? status : InContext(status, DescribeBucket("allreduce", entries));
}

Status MpiDataPlane::UseHierarchical(size_t bytes, bool* use) {
  GRADSYNC_RETURN_IF_ERROR(hierarchical_.Applies(use));
  *use = *use && static_cast<int64_t>(bytes) >= hierarchical_from_bytes_;
  return Status::OK();
}

Status MpiDataPlane::AllreduceOne(TensorEntry* entry, const ReduceSpec& spec, MPI_Datatype type,
                                  MPI_Op op) {
  const int64_t n = entry->input.num_elements();
  // Every rank holds the same shape, so every rank skips together.
  if (n == 0) return Status::OK();
  const size_t elem_size = DataTypeSize(spec.dtype);
  const size_t bytes = static_cast<size_t>(n) * elem_size;
  bool hierarchical = false;
  GRADSYNC_RETURN_IF_ERROR(UseHierarchical(bytes, &hierarchical));
  if (!hierarchical) {
    // Node shared memory, copies included, beat MPI's own allreduce in place at every size it
    // takes (docs/benchmarks.md, "Node shared memory"): a lone tensor goes through it as a bucket
    // of one. Decided from the size alone, so every rank takes the same path.
    bool shared = false;
    GRADSYNC_RETURN_IF_ERROR(shared_memory_.Prepare(bytes, &shared));
    if (shared) return AllreduceFused({entry}, spec, type, op);
  }
  // The path is chosen from the size alone, whether the tensor is whole or in pieces (a batch's
  // bucket of one, beside a joined rank's whole stand-in): a bucket's path would differ.
  if (entry->segments != nullptr) return AllreduceOnePacked(entry, spec, hierarchical, type, op);
  void* out = entry->output.data;
  const void* in = entry->input.data;
  if (hierarchical) {
    TimelineActivity activity(timeline_, entry, "HIERARCHICAL_ALLREDUCE");
    ScaledCopy(in, out, n, spec.dtype, spec.prescale);
    GRADSYNC_RETURN_IF_ERROR(
        hierarchical_.AllreduceInPlace(out, n, elem_size, type, op, piece_bytes_));
    ScaledCopy(out, out, n, spec.dtype, spec.postscale);
  } else {
    TimelineActivity activity(timeline_, entry, "MPI_ALLREDUCE");
    const PieceHooks scaling = ScalingHooks(in, out, spec.dtype, spec.prescale, spec.postscale);
    GRADSYNC_RETURN_IF_ERROR(
        AllreduceInPieces(MPI_IN_PLACE, out, n, elem_size, type, op, comm_, piece_bytes_, scaling));
  }
  return Status::OK();
}

Status MpiDataPlane::AllreduceOnePacked(TensorEntry* entry, const ReduceSpec& spec,
                                        bool hierarchical, MPI_Datatype type, MPI_Op op) {
  const int64_t n = entry->input.num_elements();
  const size_t elem_size = DataTypeSize(spec.dtype);
  const size_t bytes = static_cast<size_t>(n) * elem_size;
  const std::vector<TensorEntry*> entries = {entry};
  const std::vector<size_t> offsets = {0};
  const std::vector<int64_t> counts = {n};
  if (!hierarchical) return AllreduceFusedFlat(entries, spec, offsets, counts, bytes, type, op);
  auto* buffer = static_cast<char*>(fusion_buffer_.Get(bytes));
  PackFused(entries, spec, offsets, counts, buffer);
  {
    TimelineActivity activity(timeline_, entry, "HIERARCHICAL_ALLREDUCE");
    GRADSYNC_RETURN_IF_ERROR(
        hierarchical_.AllreduceInPlace(buffer, n, elem_size, type, op, piece_bytes_));
  }
  UnpackFused(entries, offsets, counts, buffer, spec.postscale);
  return Status::OK();
}

Status MpiDataPlane::AllreduceFused(const std::vector<TensorEntry*>& entries,
                                    const ReduceSpec& spec, MPI_Datatype type, MPI_Op op) {
  const size_t elem_size = DataTypeSize(spec.dtype);
  std::vector<size_t> offsets;
  std::vector<int64_t> counts;  // elements of each entry, computed once
  offsets.reserve(entries.size());
  counts.reserve(entries.size());
  size_t total = 0;
  for (const TensorEntry* entry : entries) {
    const int64_t count = entry->input.num_elements();
    const size_t bytes = static_cast<size_t>(count) * elem_size;  // validated: no overflow
    const size_t offset = AlignFusionOffset(total);
    if (offset < total || bytes > SIZE_MAX - offset) {
      return Status::InvalidArgument("the fused size overflows the address space");
    }
    offsets.push_back(offset);
    counts.push_back(count);
    total = offset + bytes;
  }
  if (total == 0) return Status::OK();
  bool hierarchical = false;
  GRADSYNC_RETURN_IF_ERROR(UseHierarchical(total, &hierarchical));
  if (hierarchical) {
    return AllreduceFusedHierarchical(entries, spec, offsets, counts, total, type, op);
  }
  bool shared = false;
  GRADSYNC_RETURN_IF_ERROR(shared_memory_.Prepare(total, &shared));
  last_allreduce_shared_ = shared;
  if (shared && FoldEveryRegion(size_, total)) {
    return AllreduceFusedShared(entries, spec, offsets, counts);
  }
  if (shared) {
    return AllreduceFusedSlices(entries, spec, offsets, counts, &shared_memory_, rank_, size_,
                                MPI_COMM_NULL, type, op);
  }

  if (pipeline_chunk_bytes_ > 0 && total >= 2 * static_cast<size_t>(pipeline_chunk_bytes_)) {
    return AllreduceFusedPipelined(entries, spec, offsets, counts, total, type, op);
  }
  return AllreduceFusedFlat(entries, spec, offsets, counts, total, type, op);
}

Status MpiDataPlane::AllreduceFusedFlat(const std::vector<TensorEntry*>& entries,
                                        const ReduceSpec& spec, const std::vector<size_t>& offsets,
                                        const std::vector<int64_t>& counts, size_t total,
                                        MPI_Datatype type, MPI_Op op) {
  const size_t elem_size = DataTypeSize(spec.dtype);
  auto* buffer = static_cast<char*>(fusion_buffer_.Get(total));
  // Offsets are multiples of 64, hence of every element size: the span is whole elements.
  const auto count = static_cast<int64_t>(total / elem_size);
  if (piece_bytes_ > 0 && total > static_cast<size_t>(piece_bytes_)) {
    // Each piece packed, reduced and unpacked while it is in the cache: packing and unpacking the
    // whole bucket first and last would send a bucket larger than the cache through memory twice
    // more (docs/benchmarks.md, "Work on each piece").
    TimelineActivity activity(timeline_, entries, "MPI_ALLREDUCE");
    const FusedLayout layout{entries, offsets, counts, elem_size};
    size_t packed = 0, unpacked = 0;  // tensor cursors, see CopyFusedRange
    PieceHooks copies;
    copies.before = [&](size_t begin, size_t end) {
      CopyFusedRange(layout, buffer, begin, end, true, spec.prescale, &packed);
    };
    copies.after = [&](size_t begin, size_t end) {
      CopyFusedRange(layout, buffer, begin, end, false, spec.postscale, &unpacked);
    };
    return AllreduceInPieces(MPI_IN_PLACE, buffer, count, elem_size, type, op, comm_, piece_bytes_,
                             copies);
  }
  PackFused(entries, spec, offsets, counts, buffer);
  {
    TimelineActivity activity(timeline_, entries, "MPI_ALLREDUCE");
    GRADSYNC_RETURN_IF_ERROR(
        AllreduceInPieces(MPI_IN_PLACE, buffer, count, elem_size, type, op, comm_, piece_bytes_));
  }
  UnpackFused(entries, offsets, counts, buffer, spec.postscale);
  return Status::OK();
}

Status MpiDataPlane::AllreduceFusedHierarchical(const std::vector<TensorEntry*>& entries,
                                                const ReduceSpec& spec,
                                                const std::vector<size_t>& offsets,
                                                const std::vector<int64_t>& counts, size_t total,
                                                MPI_Datatype type, MPI_Op op) {
  NodeSharedMemory* memory = hierarchical_.host_memory();
  bool shared = false;
  GRADSYNC_RETURN_IF_ERROR(memory->Prepare(total, &shared));
  if (shared) {
    return AllreduceFusedSlices(entries, spec, offsets, counts, memory, hierarchical_.local_rank(),
                                hierarchical_.local_size(), hierarchical_.cross_comm(), type, op);
  }
  auto* buffer = static_cast<char*>(fusion_buffer_.Get(total));
  PackFused(entries, spec, offsets, counts, buffer);
  const size_t elem_size = DataTypeSize(spec.dtype);
  {
    TimelineActivity activity(timeline_, entries, "HIERARCHICAL_ALLREDUCE");
    GRADSYNC_RETURN_IF_ERROR(hierarchical_.AllreduceInPlace(
        buffer, static_cast<int64_t>(total / elem_size), elem_size, type, op, piece_bytes_));
  }
  UnpackFused(entries, offsets, counts, buffer, spec.postscale);
  return Status::OK();
}

Status MpiDataPlane::AllreduceFusedSlices(const std::vector<TensorEntry*>& entries,
                                          const ReduceSpec& spec,
                                          const std::vector<size_t>& offsets,
                                          const std::vector<int64_t>& counts,
                                          NodeSharedMemory* memory, int rank, int size,
                                          MPI_Comm cross, MPI_Datatype type, MPI_Op op) {
  PackFused(entries, spec, offsets, counts, memory->Region(rank));
  const size_t elem_size = DataTypeSize(spec.dtype);
  const size_t total = offsets.back() + static_cast<size_t>(counts.back()) * elem_size;
  SliceReduction how;
  how.dtype = spec.dtype;
  how.op = spec.op;
  how.postscale = spec.postscale;
  how.cross = cross;
  how.mpi_type = type;
  how.mpi_op = op;
  how.piece_bytes = piece_bytes_;
  {
    TimelineActivity activity(timeline_, entries,
                              cross == MPI_COMM_NULL ? "SHM_ALLREDUCE" : "HIERARCHICAL_ALLREDUCE");
    GRADSYNC_RETURN_IF_ERROR(ReduceSlicesThroughSharedMemory(
        memory, rank, size, static_cast<int64_t>(total / elem_size), how));
  }
  UnpackFused(entries, offsets, counts, memory->Result(), 1.0);
  memory->Flip();
  return Status::OK();
}

void MpiDataPlane::UnpackFused(const std::vector<TensorEntry*>& entries,
                               const std::vector<size_t>& offsets,
                               const std::vector<int64_t>& counts, char* buffer, double postscale) {
  TimelineActivity activity(timeline_, entries, "MEMCPY_OUT_FUSION_BUFFER");
  const FusedLayout layout{entries, offsets, counts, DataTypeSize(entries.front()->input.dtype)};
  size_t first = 0;
  CopyFusedRange(layout, buffer, 0, layout.End(entries.size() - 1), false, postscale, &first);
}

void MpiDataPlane::PackFused(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                             const std::vector<size_t>& offsets, const std::vector<int64_t>& counts,
                             char* buffer) {
  TimelineActivity activity(timeline_, entries, "MEMCPY_IN_FUSION_BUFFER");
  const FusedLayout layout{entries, offsets, counts, DataTypeSize(spec.dtype)};
  size_t first = 0;
  CopyFusedRange(layout, buffer, 0, layout.End(entries.size() - 1), true, spec.prescale, &first);
}

Status MpiDataPlane::AllreduceFusedShared(const std::vector<TensorEntry*>& entries,
                                          const ReduceSpec& spec,
                                          const std::vector<size_t>& offsets,
                                          const std::vector<int64_t>& counts) {
  PackFused(entries, spec, offsets, counts, shared_memory_.Region(rank_));
  TimelineActivity activity(timeline_, entries, "SHM_ALLREDUCE");
  GRADSYNC_RETURN_IF_ERROR(shared_memory_.Barrier());
  const size_t elem_size = DataTypeSize(spec.dtype);
  const void* inputs[kSharedMemoryMaxRanks];
  for (size_t i = 0; i < entries.size(); ++i) {
    ForEachRun(*entries[i], true, 0, counts[i], [&](char* memory, int64_t at, int64_t n) {
      const size_t from = offsets[i] + static_cast<size_t>(at) * elem_size;
      for (int q = 0; q < size_; ++q) inputs[q] = shared_memory_.Region(q) + from;
      CombineInto(inputs, size_, memory, n, spec.dtype, spec.op, spec.postscale);
    });
  }
  shared_memory_.Flip();
  return Status::OK();
}

}  // namespace gradsync
