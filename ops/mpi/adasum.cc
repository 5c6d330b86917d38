#include "ops/mpi/adasum.h"

#include <algorithm>
#include <string>

#include "ops/scale.h"
#include "runtime/half.h"
#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

constexpr int kAdasumTag = 0x4164;
// Elements per message: MPI's counts are ints.
constexpr int64_t kMostPerMessage = int64_t{1} << 28;

template <typename T>
MPI_Datatype MpiTypeOf();
template <>
MPI_Datatype MpiTypeOf<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype MpiTypeOf<double>() {
  return MPI_DOUBLE;
}

// Sends `send` elements from `out` to `partner` while receiving `receive` into `in`, in messages
// MPI's int counts can carry.
template <typename T>
Status Trade(const T* out, int64_t send, T* in, int64_t receive, int partner, MPI_Comm comm) {
  for (int64_t sent = 0, received = 0; sent < send || received < receive;) {
    const int64_t s = std::min(send - sent, kMostPerMessage);
    const int64_t r = std::min(receive - received, kMostPerMessage);
    GRADSYNC_MPI_CALL(MPI_Sendrecv(out + sent, static_cast<int>(s), MpiTypeOf<T>(), partner,
                                   kAdasumTag, in + received, static_cast<int>(r), MpiTypeOf<T>(),
                                   partner, kAdasumTag, comm, MPI_STATUS_IGNORE));
    sent += s;
    received += r;
  }
  return Status::OK();
}

// Sums `values` over the 2 * level ranks of this rank's group (those equal to it above bit
// `level`) by recursive doubling. Each step adds two vectors in either order on the two ranks, and
// addition commutes, so every rank of the group ends with the same bits.
Status SumOverGroup(std::vector<double>* values, std::vector<double>* received, int rank, int level,
                    MPI_Comm comm) {
  received->resize(values->size());
  const int n = static_cast<int>(values->size());
  for (int step = 1; step <= level; step <<= 1) {
    GRADSYNC_MPI_CALL(MPI_Sendrecv(values->data(), n, MPI_DOUBLE, rank ^ step, kAdasumTag,
                                   received->data(), n, MPI_DOUBLE, rank ^ step, kAdasumTag, comm,
                                   MPI_STATUS_IGNORE));
    for (int i = 0; i < n; ++i) (*values)[i] += (*received)[i];
  }
  return Status::OK();
}

// a.b, a.a and b.b over n elements, added to sums[0..2]. Four partial sums of each: a single
// running sum would wait on its last addition at every element.
template <typename T>
void AddDotAndNorms(const T* a, const T* b, int64_t n, double* sums) {
  double dot[4] = {0, 0, 0, 0}, aa[4] = {0, 0, 0, 0}, bb[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int j = 0; j < 4; ++j) {
      const double x = a[k + j], y = b[k + j];
      dot[j] += x * y;
      aa[j] += x * x;
      bb[j] += y * y;
    }
  }
  for (; k < n; ++k) {
    const double x = a[k], y = b[k];
    dot[0] += x * y;
    aa[0] += x * x;
    bb[0] += y * y;
  }
  sums[0] += (dot[0] + dot[1]) + (dot[2] + dot[3]);
  sums[1] += (aa[0] + aa[1]) + (aa[2] + aa[3]);
  sums[2] += (bb[0] + bb[1]) + (bb[2] + bb[3]);
}

// The coefficient of one side: 1 where that side is zero, so that the other is kept whole.
double Coefficient(double dot, double norm_squared) {
  return norm_squared > 0 ? 1.0 - dot / (2.0 * norm_squared) : 1.0;
}

}  // namespace

template <typename T>
Status AdasumInPlace(T* data, int64_t count, const std::vector<ElementRange>& tensors,
                     MPI_Comm comm, std::vector<T>* scratch) {
  int rank = 0, size = 1;
  GRADSYNC_MPI_CALL(MPI_Comm_rank(comm, &rank));
  GRADSYNC_MPI_CALL(MPI_Comm_size(comm, &size));
  if (!IsPowerOfTwo(size)) {
    return Status::InvalidArgument("Adasum needs a process set of a power-of-two size, not " +
                                   std::to_string(size));
  }
  if (size == 1 || count == 0) return Status::OK();
  scratch->resize(static_cast<size_t>(count / 2 + 1));
  // Per tensor: the lower subtree's vector a and the upper's b give a.b, a.a and b.b.
  std::vector<double> sums(3 * tensors.size());
  std::vector<double> received;
  std::vector<ElementRange> kept, given;  // per level, for the way back
  ElementRange mine{0, count};
  for (int level = 1; level < size; level <<= 1) {
    // The partner differs only in this bit, so it has been through the same halvings: its span is
    // this rank's.
    const int partner = rank ^ level;
    const bool lower = (rank & level) == 0;
    const int64_t middle = mine.begin + mine.size() / 2;
    const ElementRange keep =
        lower ? ElementRange{mine.begin, middle} : ElementRange{middle, mine.end};
    const ElementRange give =
        lower ? ElementRange{middle, mine.end} : ElementRange{mine.begin, middle};
    T* theirs = scratch->data();  // the partner's part of `keep`
    GRADSYNC_RETURN_IF_ERROR(
        Trade(data + give.begin, give.size(), theirs, keep.size(), partner, comm));
    std::fill(sums.begin(), sums.end(), 0.0);
    for (size_t t = 0; t < tensors.size(); ++t) {
      const int64_t from = std::max(tensors[t].begin, keep.begin);
      const int64_t to = std::min(tensors[t].end, keep.end);
      if (from >= to) continue;
      const T* own = data + from;
      const T* other = theirs + (from - keep.begin);
      AddDotAndNorms(lower ? own : other, lower ? other : own, to - from, &sums[3 * t]);
    }
    GRADSYNC_RETURN_IF_ERROR(SumOverGroup(&sums, &received, rank, level, comm));
    for (size_t t = 0; t < tensors.size(); ++t) {
      const int64_t from = std::max(tensors[t].begin, keep.begin);
      const int64_t to = std::min(tensors[t].end, keep.end);
      if (from >= to) continue;
      const double a_coefficient = Coefficient(sums[3 * t], sums[3 * t + 1]);
      const double b_coefficient = Coefficient(sums[3 * t], sums[3 * t + 2]);
      const double own_coefficient = lower ? a_coefficient : b_coefficient;
      const double other_coefficient = lower ? b_coefficient : a_coefficient;
      T* own = data + from;
      const T* other = theirs + (from - keep.begin);
      for (int64_t k = 0; k < to - from; ++k) {
        own[k] = static_cast<T>(own_coefficient * own[k] + other_coefficient * other[k]);
      }
    }
    kept.push_back(keep);
    given.push_back(give);
    mine = keep;
  }
  // Back up the tree: each level's partner holds the half this rank gave it, combined.
  for (size_t level = kept.size(); level-- > 0;) {
    const int partner = rank ^ (1 << level);
    GRADSYNC_RETURN_IF_ERROR(Trade(data + kept[level].begin, kept[level].size(),
                                   data + given[level].begin, given[level].size(), partner, comm));
  }
  return Status::OK();
}

template Status AdasumInPlace<float>(float*, int64_t, const std::vector<ElementRange>&, MPI_Comm,
                                     std::vector<float>*);
template Status AdasumInPlace<double>(double*, int64_t, const std::vector<ElementRange>&, MPI_Comm,
                                      std::vector<double>*);

int64_t PackedAdasumRanges(const std::vector<TensorEntry*>& entries,
                           std::vector<ElementRange>* ranges) {
  ranges->clear();
  int64_t total = 0;
  for (const TensorEntry* entry : entries) {
    ranges->push_back({total, total + entry->input.num_elements()});
    total = ranges->back().end;
  }
  return total;
}

Status AdasumBuffer(void* data, DataType dtype, int64_t count,
                    const std::vector<ElementRange>& tensors, double prescale, double postscale,
                    MPI_Comm comm, AdasumScratch* scratch) {
  switch (dtype) {
    case DataType::kFloat32:
    case DataType::kFloat64: {
      ScaledCopy(data, data, count, dtype, prescale);
      const Status status =
          dtype == DataType::kFloat32
              ? AdasumInPlace(static_cast<float*>(data), count, tensors, comm, &scratch->floats)
              : AdasumInPlace(static_cast<double*>(data), count, tensors, comm, &scratch->doubles);
      if (status.ok()) ScaledCopy(data, data, count, dtype, postscale);
      return status;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      const bool bfloat = dtype == DataType::kBFloat16;
      const auto pre = static_cast<float>(prescale);
      const auto post = static_cast<float>(postscale);
      auto* narrow = static_cast<uint16_t*>(data);
      scratch->wide.resize(static_cast<size_t>(count));
      float* wide = scratch->wide.data();
      for (int64_t k = 0; k < count; ++k) {
        wide[k] = pre * (bfloat ? BFloat16ToFloat(narrow[k]) : HalfToFloat(narrow[k]));
      }
      GRADSYNC_RETURN_IF_ERROR(AdasumInPlace(wide, count, tensors, comm, &scratch->floats));
      for (int64_t k = 0; k < count; ++k) {
        const float value = post * wide[k];
        narrow[k] = bfloat ? FloatToBFloat16(value) : FloatToHalf(value);
      }
      return Status::OK();
    }
    default:
      return Status::InvalidArgument("Adasum reduces floating-point tensors, not " +
                                     DataTypeName(dtype));
  }
}

}  // namespace gradsync
