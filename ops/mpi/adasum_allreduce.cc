// The MPI data plane's Adasum bucket: its tensors packed back to back into the fusion buffer, in
// float or double (half precision widened to float, scaled there), combined by ops/mpi/adasum.h,
// and copied out.
#include <cstdint>
#include <string>
#include <vector>

#include "ops/mpi/adasum.h"
#include "ops/mpi/entry_pieces.h"
#include "ops/mpi/mpi_data_plane.h"
#include "ops/scale.h"
#include "runtime/half.h"
#include "runtime/timeline_activity.h"

namespace gradsync {
namespace {

template <typename T>
Status AdasumPacked(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                    const std::vector<ElementRange>& tensors, int64_t total, MPI_Comm comm,
                    T* packed, std::vector<T>* scratch) {
  auto* bytes = reinterpret_cast<char*>(packed);
  for (size_t t = 0; t < entries.size(); ++t) {
    CopyEntryIn(*entries[t], 0, tensors[t].size(), spec.prescale,
                bytes + tensors[t].begin * static_cast<int64_t>(sizeof(T)));
  }
  GRADSYNC_RETURN_IF_ERROR(AdasumInPlace(packed, total, tensors, comm, scratch));
  for (size_t t = 0; t < entries.size(); ++t) {
    CopyEntryOut(bytes + tensors[t].begin * static_cast<int64_t>(sizeof(T)), 0, tensors[t].size(),
                 spec.postscale, *entries[t]);
  }
  return Status::OK();
}

// Half precision: widened into `wide`, scaled and combined there in float32, and narrowed back,
// so that a large prescale undone by the postscale does not overflow 16 bits in between.
Status AdasumWidened(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                     const std::vector<ElementRange>& tensors, int64_t total, MPI_Comm comm,
                     float* wide, std::vector<uint16_t>* narrow, std::vector<float>* scratch) {
  const bool bfloat = spec.dtype == DataType::kBFloat16;
  const auto prescale = static_cast<float>(spec.prescale);
  const auto postscale = static_cast<float>(spec.postscale);
  for (size_t t = 0; t < entries.size(); ++t) {
    const int64_t n = tensors[t].size();
    narrow->resize(static_cast<size_t>(n));
    CopyEntryIn(*entries[t], 0, n, 1.0, reinterpret_cast<char*>(narrow->data()));
    float* to = wide + tensors[t].begin;
    for (int64_t k = 0; k < n; ++k) {
      to[k] = prescale * (bfloat ? BFloat16ToFloat((*narrow)[k]) : HalfToFloat((*narrow)[k]));
    }
  }
  GRADSYNC_RETURN_IF_ERROR(AdasumInPlace(wide, total, tensors, comm, scratch));
  for (size_t t = 0; t < entries.size(); ++t) {
    const int64_t n = tensors[t].size();
    narrow->resize(static_cast<size_t>(n));
    const float* from = wide + tensors[t].begin;
    for (int64_t k = 0; k < n; ++k) {
      const float value = postscale * from[k];
      (*narrow)[k] = bfloat ? FloatToBFloat16(value) : FloatToHalf(value);
    }
    CopyEntryOut(reinterpret_cast<const char*>(narrow->data()), 0, n, 1.0, *entries[t]);
  }
  return Status::OK();
}

}  // namespace

Status MpiDataPlane::AllreduceAdasum(const std::vector<TensorEntry*>& entries,
                                     const ReduceSpec& spec) {
  TimelineActivity activity(timeline_, entries, "ADASUM_ALLREDUCE");
  std::vector<ElementRange> tensors;
  tensors.reserve(entries.size());
  int64_t total = 0;
  for (const TensorEntry* entry : entries) {
    const int64_t n = entry->input.num_elements();
    tensors.push_back({total, total + n});
    total += n;
  }
  const bool single_precision = spec.dtype == DataType::kFloat32;
  if (entries.size() == 1 && entries[0]->segments == nullptr &&
      (single_precision || spec.dtype == DataType::kFloat64)) {
    // A tensor alone is combined where its result goes: no copy but the scales' (and the input
    // to an output elsewhere).
    TensorEntry& entry = *entries[0];
    void* out = entry.output.data;
    ScaledCopy(entry.input.data, out, total, spec.dtype, spec.prescale);
    const Status status = single_precision ? AdasumInPlace(static_cast<float*>(out), total, tensors,
                                                           comm_, &adasum_.float_scratch)
                                           : AdasumInPlace(static_cast<double*>(out), total,
                                                           tensors, comm_, &adasum_.double_scratch);
    if (status.ok()) ScaledCopy(out, out, total, spec.dtype, spec.postscale);
    return status;
  }
  // The bucket is packed into the fusion buffer, as the other paths pack theirs.
  const auto elements = static_cast<size_t>(total);
  switch (spec.dtype) {
    case DataType::kFloat32:
      return AdasumPacked(entries, spec, tensors, total, comm_,
                          static_cast<float*>(fusion_buffer_.Get(elements * sizeof(float))),
                          &adasum_.float_scratch);
    case DataType::kFloat64:
      return AdasumPacked(entries, spec, tensors, total, comm_,
                          static_cast<double*>(fusion_buffer_.Get(elements * sizeof(double))),
                          &adasum_.double_scratch);
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return AdasumWidened(entries, spec, tensors, total, comm_,
                           static_cast<float*>(fusion_buffer_.Get(elements * sizeof(float))),
                           &adasum_.narrow, &adasum_.float_scratch);
    default:
      return Status::InvalidArgument("Adasum reduces floating-point tensors, not " +
                                     DataTypeName(spec.dtype));
  }
}

}  // namespace gradsync
