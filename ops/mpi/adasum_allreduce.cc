// The MPI data plane's Adasum bucket: its tensors packed back to back into the fusion buffer (a
// tensor alone combined where its result goes), combined by AdasumBuffer (ops/mpi/adasum.h), and
// copied out.
#include <cstdint>
#include <string>
#include <vector>

#include "ops/mpi/adasum.h"
#include "ops/mpi/entry_pieces.h"
#include "ops/mpi/mpi_data_plane.h"
#include "ops/scale.h"
#include "runtime/timeline_activity.h"

namespace gradsync {

Status MpiDataPlane::AllreduceAdasum(const std::vector<TensorEntry*>& entries,
                                     const ReduceSpec& spec) {
  TimelineActivity activity(timeline_, entries, "ADASUM_ALLREDUCE");
  std::vector<ElementRange> tensors;
  const int64_t total = PackedAdasumRanges(entries, &tensors);
  if (entries.size() == 1 && entries[0]->segments == nullptr) {
    // A tensor alone is combined where its result goes: no copy but the input's to an output
    // elsewhere.
    TensorEntry& entry = *entries[0];
    ScaledCopy(entry.input.data, entry.output.data, total, spec.dtype, 1.0);
    return AdasumBuffer(entry.output.data, spec.dtype, total, tensors, spec.prescale,
                        spec.postscale, comm_, &adasum_scratch_);
  }
  // The bucket is packed into the fusion buffer, as the other paths pack theirs.
  const size_t element = DataTypeSize(spec.dtype);
  char* packed = static_cast<char*>(fusion_buffer_.Get(static_cast<size_t>(total) * element));
  for (size_t t = 0; t < entries.size(); ++t) {
    CopyEntryIn(*entries[t], 0, tensors[t].size(), 1.0,
                packed + static_cast<size_t>(tensors[t].begin) * element);
  }
  GRADSYNC_RETURN_IF_ERROR(AdasumBuffer(packed, spec.dtype, total, tensors, spec.prescale,
                                        spec.postscale, comm_, &adasum_scratch_));
  for (size_t t = 0; t < entries.size(); ++t) {
    CopyEntryOut(packed + static_cast<size_t>(tensors[t].begin) * element, 0, tensors[t].size(),
                 1.0, *entries[t]);
  }
  return Status::OK();
}

}  // namespace gradsync
