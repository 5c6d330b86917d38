#include "ops/mpi/mpi_types.h"

#include <algorithm>
#include <climits>
#include <string>

#include "ops/scale.h"
#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

// float16 and bfloat16 travel as a committed contiguous type of two MPI_BYTEs rather than as
// MPI_UINT16_T: MPI rejects a predefined reduction op on a derived type (MPI_ERR_OP), so pairing
// one of these dtypes with MPI_SUM by mistake fails loudly instead of summing bit patterns as
// integers. Each dtype gets its own type so the two can never be confused either.
struct HalfTypes {
  MPI_Datatype float16 = MPI_DATATYPE_NULL;
  MPI_Datatype bfloat16 = MPI_DATATYPE_NULL;
  Status status;
};

Status CreateHalfType(MPI_Datatype* out) {
  GRADSYNC_RETURN_IF_ERROR(MpiResult(MPI_Type_contiguous(2, MPI_BYTE, out), "MPI_Type_contiguous"));
  return MpiResult(MPI_Type_commit(out), "MPI_Type_commit");
}

// Created on first use and kept until MPI_Finalize frees them, since MPI cannot be initialized
// twice in one process.
const HalfTypes& GetHalfTypes() {
  static const HalfTypes types = [] {
    HalfTypes t;
    t.status = CreateHalfType(&t.float16);
    if (t.status.ok()) t.status = CreateHalfType(&t.bfloat16);
    return t;
  }();
  return types;
}

void SumFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceHalfPrecision(in, inout, *len, DataType::kFloat16, ReduceOp::kSum);
}
void MinFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceHalfPrecision(in, inout, *len, DataType::kFloat16, ReduceOp::kMin);
}
void MaxFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceHalfPrecision(in, inout, *len, DataType::kFloat16, ReduceOp::kMax);
}
void ProductFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceHalfPrecision(in, inout, *len, DataType::kFloat16, ReduceOp::kProduct);
}
void SumBFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceHalfPrecision(in, inout, *len, DataType::kBFloat16, ReduceOp::kSum);
}
void MinBFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceHalfPrecision(in, inout, *len, DataType::kBFloat16, ReduceOp::kMin);
}
void MaxBFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceHalfPrecision(in, inout, *len, DataType::kBFloat16, ReduceOp::kMax);
}
void ProductBFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceHalfPrecision(in, inout, *len, DataType::kBFloat16, ReduceOp::kProduct);
}

// Rows: float16, bfloat16; columns: sum, min, max, product.
constexpr int kNumOps = 4;
MPI_User_function* const kHalfFunctions[2][kNumOps] = {
    {SumFloat16, MinFloat16, MaxFloat16, ProductFloat16},
    {SumBFloat16, MinBFloat16, MaxBFloat16, ProductBFloat16},
};

struct HalfOps {
  MPI_Op ops[2][kNumOps];
  Status status;
};

const HalfOps& GetHalfOps() {
  static const HalfOps ops = [] {
    HalfOps o;
    for (int t = 0; t < 2; ++t) {
      for (int i = 0; i < kNumOps; ++i) {
        o.ops[t][i] = MPI_OP_NULL;
        if (!o.status.ok()) continue;
        o.status = MpiResult(MPI_Op_create(kHalfFunctions[t][i], /*commute=*/1, &o.ops[t][i]),
                             "MPI_Op_create");
      }
    }
    return o;
  }();
  return ops;
}

// Position in the [sum, min, max, product] rows; -1 for an op with no MPI equivalent.
int HalfOpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return 0;
    case ReduceOp::kMin:
      return 1;
    case ReduceOp::kMax:
      return 2;
    case ReduceOp::kProduct:
      return 3;
    case ReduceOp::kAdasum:  // an algorithm of its own (ops/mpi/adasum.h)
      return -1;
  }
  return -1;
}

Status UnsupportedPair(DataType dtype, ReduceOp op) {
  return Status::Unsupported("no MPI reduction for dtype " + DataTypeName(dtype) + " with op " +
                             ReduceOpName(op));
}

}  // namespace

MPI_Datatype MpiDatatypeOf(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return MPI_UINT8_T;
    case DataType::kInt8:
      return MPI_INT8_T;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    // A creation failure leaves MPI_DATATYPE_NULL, which the next MPI call rejects;
    // MpiReduceOpOf reports the failure itself.
    case DataType::kFloat16:
      return GetHalfTypes().float16;
    case DataType::kBFloat16:
      return GetHalfTypes().bfloat16;
  }
  return MPI_DATATYPE_NULL;
}

Status MpiReduceOpOf(DataType dtype, ReduceOp op, MPI_Op* out) {
  const int index = HalfOpIndex(op);
  if (!IsValidDataType(dtype) || index < 0) return UnsupportedPair(dtype, op);
  if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
    GRADSYNC_RETURN_IF_ERROR(GetHalfTypes().status);
    const HalfOps& half_ops = GetHalfOps();
    GRADSYNC_RETURN_IF_ERROR(half_ops.status);
    *out = half_ops.ops[dtype == DataType::kBFloat16 ? 1 : 0][index];
    return Status::OK();
  }
  static const MPI_Op kNativeOps[kNumOps] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  *out = kNativeOps[index];
  return Status::OK();
}

PieceHooks ScalingHooks(const void* in, void* out, DataType dtype, double prescale,
                        double postscale) {
  const size_t elem_size = DataTypeSize(dtype);
  PieceHooks hooks;
  // Out of place too: MPI_IN_PLACE must be passed by every rank or none, and a joined rank's
  // stand-in (or another rank's in-place tensor) reduces in place.
  if (prescale != 1.0 || in != out) {
    hooks.before = [=](size_t begin, size_t end) {
      ScaledCopy(static_cast<const char*>(in) + begin, static_cast<char*>(out) + begin,
                 static_cast<int64_t>((end - begin) / elem_size), dtype, prescale);
    };
  }
  if (postscale != 1.0) {
    hooks.after = [=](size_t begin, size_t end) {
      char* piece = static_cast<char*>(out) + begin;
      ScaledCopy(piece, piece, static_cast<int64_t>((end - begin) / elem_size), dtype, postscale);
    };
  }
  return hooks;
}

Status AllreduceInPieces(const void* send, void* recv, int64_t count, size_t elem_size,
                         MPI_Datatype type, MPI_Op op, MPI_Comm comm, int64_t piece_bytes,
                         const PieceHooks& hooks) {
  const bool in_place = send == MPI_IN_PLACE;
  if (hooks.before && !in_place) {
    return Status::InvalidArgument("AllreduceInPieces: a piece filled by a hook is in place");
  }
  const int64_t most =
      piece_bytes > 0
          ? std::clamp<int64_t>(piece_bytes / static_cast<int64_t>(elem_size), 1, INT_MAX)
          : INT_MAX;
  for (int64_t done = 0; done < count;) {
    const int piece = static_cast<int>(std::min<int64_t>(count - done, most));
    const size_t begin = static_cast<size_t>(done) * elem_size;
    const size_t end = begin + static_cast<size_t>(piece) * elem_size;
    if (hooks.before) hooks.before(begin, end);
    const void* piece_send = in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + begin;
    const int rc =
        MPI_Allreduce(piece_send, static_cast<char*>(recv) + begin, piece, type, op, comm);
    GRADSYNC_RETURN_IF_ERROR(MpiResult(rc, "MPI_Allreduce"));
    if (hooks.after) hooks.after(begin, end);
    done += piece;
  }
  return Status::OK();
}

}  // namespace gradsync
