// The MPI data plane's Adasum bucket: its tensors packed back to back, in float or double (half
// precision is widened to float, as the dot products need), combined by ops/mpi/adasum.h, and
// copied out.
#include <string>
#include <vector>

#include "ops/mpi/adasum.h"
#include "ops/mpi/entry_pieces.h"
#include "ops/mpi/mpi_data_plane.h"
#include "runtime/half.h"
#include "runtime/timeline_activity.h"

namespace gradsync {
namespace {

template <typename T>
Status AdasumPacked(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                    const std::vector<ElementRange>& tensors, int64_t total, MPI_Comm comm,
                    std::vector<T>* work, std::vector<T>* scratch) {
  work->resize(static_cast<size_t>(total));
  auto* packed = reinterpret_cast<char*>(work->data());
  for (size_t t = 0; t < entries.size(); ++t) {
    CopyEntryIn(*entries[t], 0, tensors[t].end - tensors[t].begin, spec.prescale,
                packed + tensors[t].begin * static_cast<int64_t>(sizeof(T)));
  }
  GRADSYNC_RETURN_IF_ERROR(AdasumInPlace(work->data(), total, tensors, comm, scratch));
  for (size_t t = 0; t < entries.size(); ++t) {
    CopyEntryOut(packed + tensors[t].begin * static_cast<int64_t>(sizeof(T)), 0,
                 tensors[t].end - tensors[t].begin, spec.postscale, *entries[t]);
  }
  return Status::OK();
}

// Half precision: widened into `work` (as float), combined there, and narrowed back.
Status AdasumWidened(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                     const std::vector<ElementRange>& tensors, int64_t total, MPI_Comm comm,
                     std::vector<float>* work, std::vector<float>* scratch) {
  const bool bfloat = spec.dtype == DataType::kBFloat16;
  std::vector<uint16_t> narrow;
  work->resize(static_cast<size_t>(total));
  for (size_t t = 0; t < entries.size(); ++t) {
    const int64_t n = tensors[t].end - tensors[t].begin;
    narrow.resize(static_cast<size_t>(n));
    CopyEntryIn(*entries[t], 0, n, spec.prescale, reinterpret_cast<char*>(narrow.data()));
    float* wide = work->data() + tensors[t].begin;
    for (int64_t k = 0; k < n; ++k) {
      wide[k] = bfloat ? BFloat16ToFloat(narrow[k]) : HalfToFloat(narrow[k]);
    }
  }
  GRADSYNC_RETURN_IF_ERROR(AdasumInPlace(work->data(), total, tensors, comm, scratch));
  for (size_t t = 0; t < entries.size(); ++t) {
    const int64_t n = tensors[t].end - tensors[t].begin;
    narrow.resize(static_cast<size_t>(n));
    const float* wide = work->data() + tensors[t].begin;
    for (int64_t k = 0; k < n; ++k) {
      narrow[k] = bfloat ? FloatToBFloat16(wide[k]) : FloatToHalf(wide[k]);
    }
    CopyEntryOut(reinterpret_cast<const char*>(narrow.data()), 0, n, spec.postscale, *entries[t]);
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
  switch (spec.dtype) {
    case DataType::kFloat32:
      return AdasumPacked(entries, spec, tensors, total, comm_, &adasum_.floats,
                          &adasum_.float_scratch);
    case DataType::kFloat64:
      return AdasumPacked(entries, spec, tensors, total, comm_, &adasum_.doubles,
                          &adasum_.double_scratch);
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return AdasumWidened(entries, spec, tensors, total, comm_, &adasum_.floats,
                           &adasum_.float_scratch);
    default:
      return Status::InvalidArgument("Adasum reduces floating-point tensors, not " +
                                     DataTypeName(spec.dtype));
  }
}

}  // namespace gradsync
