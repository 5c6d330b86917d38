#include "ops/device/device_plane.h"

#include <algorithm>
#include <utility>

#include "ops/device/producer_readiness.h"
#include "ops/mpi/adasum.h"
#include "ops/mpi/mpi_types.h"
#include "runtime/fusion_buffer.h"
#include "runtime/mpi_context.h"
#include "runtime/op_state.h"

namespace gradsync {
namespace {

// Elements of one row: the product of every dimension after the first (1 for a vector).
int64_t RowElements(const TensorView& view) {
  int64_t row = 1;
  for (size_t d = 1; d < view.shape.size(); ++d) row *= view.shape[d];
  return row;
}

std::vector<int64_t> Scaled(const std::vector<int64_t>& rows, int64_t row_elements) {
  std::vector<int64_t> counts(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) counts[r] = rows[r] * row_elements;
  return counts;
}

std::vector<int64_t> WithFirstDim(const std::vector<int64_t>& shape, int64_t first) {
  std::vector<int64_t> out = shape;
  if (out.empty()) out.push_back(first);
  out[0] = first;
  return out;
}

char* At(void* base, int64_t elements, size_t element_size) {
  return static_cast<char*>(base) + elements * static_cast<int64_t>(element_size);
}

}  // namespace

DevicePlane::DevicePlane(std::unique_ptr<DeviceBackend> backend, MPI_Comm comm,
                         std::chrono::nanoseconds timeout)
    : backend_(std::move(backend)), comm_(comm), timeout_(timeout) {}

DevicePlane::~DevicePlane() {
  ReleaseStandIns();
  if (fusion_ != nullptr) backend_->FreeAfterWork(fusion_);
}

Status DevicePlane::Failed() const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  return aborted_ ? abort_status_ : Status::OK();
}

Status DevicePlane::BeginCall() {
  completion_.reset();
  failed_here_.clear();
  return Failed();
}

void DevicePlane::Abort(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_status_ = status;
  }
  backend_->Abort(status);
}

Status DevicePlane::CheckAsyncError() { return backend_->CheckAsyncError(); }

std::shared_ptr<StreamEvent> DevicePlane::TakeCompletion() { return std::move(completion_); }

Status DevicePlane::InContext(const Status& status, const std::string& collective,
                              const std::vector<TensorEntry*>& entries) {
  return Status(status.code(), DescribeBucket(collective, entries) + ": " + status.message());
}

// One wait per producer stream, not per tensor: a bucket's gradients mostly come from one stream,
// whose latest event implies the others.
Status DevicePlane::WaitForInputs(const std::vector<TensorEntry*>& entries) {
  const Status recorded = RecordProducerReadiness(entries);
  if (!recorded.ok()) {
    return Status(recorded.code(), "recording the producer's readiness: " + recorded.message());
  }
  ready_scratch_.clear();
  for (TensorEntry* entry : entries) {
    if (entry->ready != nullptr) ready_scratch_.push_back(entry->ready.get());
  }
  if (ready_scratch_.empty()) return Status::OK();
  for (StreamEvent* latest : LatestPerSource(ready_scratch_)) {
    for (TensorEntry* entry : entries) {
      if (entry->ready.get() == latest) {
        backend_->stream()->WaitFor(entry->ready);
        break;
      }
    }
  }
  return Status::OK();
}

void DevicePlane::MarkPhase(const char* ended) {
  if (record_phases_) phases_.push_back({ended, backend_->stream()->RecordTimed()});
}

Status DevicePlane::FinishLaunch(const std::vector<TensorEntry*>& entries, const char* last) {
  if (record_phases_) {
    completion_ = backend_->stream()->RecordTimed();
    phases_.push_back({last, completion_});
  } else {
    completion_ = backend_->stream()->Record();
  }
  for (TensorEntry* entry : entries) {
    const bool failed =
        std::find(failed_here_.begin(), failed_here_.end(), entry) != failed_here_.end();
    if (entry->state != nullptr && !failed) entry->state->SetLaunched(completion_);
  }
  OpState::AnnounceLaunches();
  return Status::OK();
}

ReduceOp DevicePlane::CollectiveOp(const ReduceSpec& spec) {
  return spec.op == ReduceOp::kAverage ? ReduceOp::kSum : spec.op;
}

double DevicePlane::Postscale(const ReduceSpec& spec) const {
  return spec.op == ReduceOp::kAverage ? spec.postscale / backend_->size() : spec.postscale;
}

Status DevicePlane::FusionBuffer(size_t bytes, void** buffer) {
  if (bytes > fusion_capacity_) {
    // Twice what is asked, at most 64 MiB more: the next larger bucket rarely needs a new one.
    // Where that much is not free, exactly what is asked: a failure here aborts the plane.
    size_t grown = bytes + std::min<size_t>(bytes, size_t{64} << 20);
    void* fresh = nullptr;
    if (!backend_->Allocate(grown, &fresh).ok()) {
      grown = bytes;
      GRADSYNC_RETURN_IF_ERROR(backend_->Allocate(grown, &fresh));
    }
    if (fusion_ != nullptr) backend_->FreeAfterWork(fusion_);  // once queued work is done with it
    fusion_ = fresh;
    fusion_capacity_ = grown;
  }
  *buffer = fusion_;
  return Status::OK();
}

// Any failure after the first queued piece of work, or once the other ranks are committed to the
// collective (a fusion buffer or scratch that cannot be allocated), leaves this rank out of step
// with the others (some may be inside the collective already): the plane is aborted, so that
// nothing later pairs with their collective or waits on it, and every rank's finalizer sees the
// failure or its timeout.
#define GRADSYNC_LAUNCH(call, collective, entries)                     \
  do {                                                                 \
    const Status launch_status_ = (call);                              \
    if (!launch_status_.ok()) {                                        \
      Status failed_ = InContext(launch_status_, collective, entries); \
      Abort(failed_);                                                  \
      return failed_;                                                  \
    }                                                                  \
  } while (false)

Status DevicePlane::Allreduce(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) {
  GRADSYNC_RETURN_IF_ERROR(BeginCall());
  if (entries.empty()) return Status::OK();
  if (spec.op == ReduceOp::kAdasum && !IsFloatingPoint(spec.dtype)) {  // refused at enqueue
    return InContext(Status::InvalidArgument("Adasum reduces floating-point tensors, not " +
                                             DataTypeName(spec.dtype)),
                     "allreduce", entries);
  }
  const size_t element_size = DataTypeSize(spec.dtype);
  for (const TensorEntry* entry : entries) {
    if (entry->input.dtype != spec.dtype || entry->input.num_elements() < 0) {
      return InContext(Status::InvalidArgument("dtype or shape differs from the bucket's"),
                       "allreduce", entries);
    }
  }
  GRADSYNC_RETURN_IF_ERROR(LayOutBucket(entries, element_size, &layout_));
  phases_.clear();
  GRADSYNC_LAUNCH(WaitForInputs(entries), "allreduce", entries);
  MarkPhase("DEVICE_QUEUE");
  segments_.clear();
  if (spec.op == ReduceOp::kAdasum) return AllreduceAdasum(entries, spec);
  // The count is the same on every rank, so an empty bucket skips the collective everywhere.
  const auto count = static_cast<int64_t>(layout_.bytes / element_size);
  if (count == 0) return FinishLaunch(entries, "DEVICE_ALLREDUCE");
  const void* input = nullptr;
  void* output = nullptr;
  if (FindBucketInPlace(entries, layout_, &input, &output)) {
    return AllreduceWhereItLies(entries, spec, input, output, count);
  }
  return AllreduceFused(entries, spec, count);
}

// A tensor alone, or a bucket whose tensors lie back to back as the layout packs them: no copy
// unless a scale needs one. Unscaled, the collective reads the input itself: an out-of-place
// operation costs no copy launch either (the library reduces from one buffer into another).
Status DevicePlane::AllreduceWhereItLies(const std::vector<TensorEntry*>& entries,
                                         const ReduceSpec& spec, const void* input, void* output,
                                         int64_t count) {
  const char* last = "DEVICE_ALLREDUCE";
  if (spec.prescale != 1.0) {
    segments_.push_back({input, output, count, spec.prescale});
    GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "allreduce", entries);
    MarkPhase("DEVICE_COPY_IN");
    input = output;
  }
  GRADSYNC_LAUNCH(backend_->Allreduce(input, output, count, spec.dtype, CollectiveOp(spec)),
                  "allreduce", entries);
  const double postscale = Postscale(spec);
  if (postscale != 1.0) {
    MarkPhase("DEVICE_ALLREDUCE");
    segments_.assign(1, CopySegment{output, output, count, postscale});
    GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "allreduce", entries);
    last = "DEVICE_SCALE";
  }
  return FinishLaunch(entries, last);
}

Status DevicePlane::AllreduceFused(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                                   int64_t count) {
  void* fusion = nullptr;
  GRADSYNC_LAUNCH(FusionBuffer(layout_.bytes, &fusion), "allreduce", entries);
  for (size_t i = 0; i < entries.size(); ++i) {
    segments_.push_back({entries[i]->input.data, static_cast<char*>(fusion) + layout_.offsets[i],
                         entries[i]->input.num_elements(), spec.prescale});
  }
  GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "allreduce", entries);
  MarkPhase("DEVICE_COPY_IN");
  GRADSYNC_LAUNCH(backend_->Allreduce(fusion, fusion, count, spec.dtype, CollectiveOp(spec)),
                  "allreduce", entries);
  MarkPhase("DEVICE_ALLREDUCE");
  const double postscale = Postscale(spec);
  for (size_t i = 0; i < entries.size(); ++i) {
    segments_[i] = {static_cast<char*>(fusion) + layout_.offsets[i], entries[i]->output.data,
                    entries[i]->input.num_elements(), postscale};
  }
  GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "allreduce", entries);
  return FinishLaunch(entries, "DEVICE_COPY_OUT");
}

// Adasum combines each tensor as itself, over the bucket packed back to back with no gap between
// tensors, as the MPI plane packs it: both then halve it at the same elements and give the same
// bits. The backend combines it, scales included (DeviceBackend::Adasum), where it lies when the
// tensors are back to back already (copied first into outputs elsewhere), else in the fusion
// buffer.
Status DevicePlane::AllreduceAdasum(const std::vector<TensorEntry*>& entries,
                                    const ReduceSpec& spec) {
  const size_t element_size = DataTypeSize(spec.dtype);
  const int64_t count = PackedAdasumRanges(entries, &adasum_tensors_);
  if (count == 0) return FinishLaunch(entries, "DEVICE_ADASUM");
  const void* input = nullptr;
  void* output = nullptr;
  const bool where_it_lies = FindBucketInPlace(entries, layout_, &input, &output);
  void* bucket = output;
  if (!where_it_lies) GRADSYNC_LAUNCH(FusionBuffer(layout_.bytes, &bucket), "allreduce", entries);
  auto* packed = static_cast<char*>(bucket);
  if (where_it_lies && input != output) {
    segments_.push_back({input, output, count, 1.0});
  } else if (!where_it_lies) {
    for (size_t i = 0; i < entries.size(); ++i) {
      segments_.push_back({entries[i]->input.data,
                           packed + static_cast<size_t>(adasum_tensors_[i].begin) * element_size,
                           adasum_tensors_[i].size(), 1.0});
    }
  }
  if (!segments_.empty()) {
    GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "allreduce", entries);
    MarkPhase("DEVICE_COPY_IN");
  }
  GRADSYNC_LAUNCH(
      backend_->Adasum(bucket, spec.dtype, count, adasum_tensors_, spec.prescale, spec.postscale),
      "allreduce", entries);
  if (where_it_lies) return FinishLaunch(entries, "DEVICE_ADASUM");
  MarkPhase("DEVICE_ADASUM");
  for (size_t i = 0; i < entries.size(); ++i) {
    segments_[i] = {packed + static_cast<size_t>(adasum_tensors_[i].begin) * element_size,
                    entries[i]->output.data, adasum_tensors_[i].size(), 1.0};
  }
  GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "allreduce", entries);
  return FinishLaunch(entries, "DEVICE_COPY_OUT");
}

Status DevicePlane::Allgather(TensorEntry* entry, const std::vector<int64_t>& first_dims) {
  GRADSYNC_RETURN_IF_ERROR(BeginCall());
  const std::vector<TensorEntry*> entries{entry};
  const int64_t row = RowElements(entry->input);
  const std::vector<int64_t> counts = Scaled(first_dims, row);
  int64_t rows = 0;
  for (int64_t d : first_dims) rows += d;
  const std::vector<int64_t> shape = WithFirstDim(entry->input.shape, rows);
  const size_t bytes = static_cast<size_t>(rows * row) * DataTypeSize(entry->input.dtype);
  std::string thrown;
  void* output = bytes == 0 ? nullptr : AllocateOutputMemory(*entry, shape, &thrown);
  Status local;
  if (output == nullptr && bytes > 0) {
    // The other ranks are committed: take part, receiving into scratch, and fail here alone.
    local = InContext(NoOutputMemory(shape, thrown), "allgather", entries);
    failed_here_.push_back(entry);
    GRADSYNC_LAUNCH(FusionBuffer(bytes, &output), "allgather", entries);
  } else {
    entry->output = TensorView(output, entry->input.dtype, shape, entry->input.device);
    entry->state->output_shape = shape;
  }
  phases_.clear();
  GRADSYNC_LAUNCH(WaitForInputs(entries), "allgather", entries);
  MarkPhase("DEVICE_QUEUE");
  GRADSYNC_LAUNCH(backend_->Allgatherv(entry->input.data, output, counts, entry->input.dtype),
                  "allgather", entries);
  GRADSYNC_RETURN_IF_ERROR(FinishLaunch(entries, "DEVICE_ALLGATHER"));
  return local;
}

Status DevicePlane::Broadcast(TensorEntry* entry, int root) {
  GRADSYNC_RETURN_IF_ERROR(BeginCall());
  const std::vector<TensorEntry*> entries{entry};
  phases_.clear();
  GRADSYNC_LAUNCH(WaitForInputs(entries), "broadcast", entries);
  MarkPhase("DEVICE_QUEUE");
  const int64_t count = entry->input.num_elements();
  if (count > 0) {
    GRADSYNC_LAUNCH(backend_->Broadcast(entry->input.data, count, entry->input.dtype, root),
                    "broadcast", entries);
  }
  entry->output = entry->input;
  return FinishLaunch(entries, "DEVICE_BROADCAST");
}

Status DevicePlane::Alltoall(TensorEntry* entry) {
  // The splits exchange below is a blocking collective on the host: every rank takes part, an
  // aborted plane's too (planes abort one rank at a time), before any of them fails.
  const Status began = BeginCall();
  const std::vector<TensorEntry*> entries{entry};
  const int size = backend_->size();
  const int64_t rows = entry->input.shape.empty() ? 1 : entry->input.shape[0];
  std::vector<int64_t> splits = entry->splits.empty() ? EvenSplits(rows, size) : entry->splits;
  const Status valid = CheckSplits(splits, rows, size);  // checked at enqueue: not expected
  if (!valid.ok()) splits.assign(size, 0);
  std::vector<int64_t> received(size);
  // The host side learns what it receives first, so that it can size the output.
  GRADSYNC_MPI_CALL(
      MPI_Alltoall(splits.data(), 1, MPI_INT64_T, received.data(), 1, MPI_INT64_T, comm_));
  GRADSYNC_RETURN_IF_ERROR(began);
  GRADSYNC_RETURN_IF_ERROR(valid);
  int64_t received_rows = 0;
  for (int64_t r : received) received_rows += r;
  const int64_t row = RowElements(entry->input);
  const std::vector<int64_t> shape = WithFirstDim(entry->input.shape, received_rows);
  const size_t bytes = static_cast<size_t>(received_rows * row) * DataTypeSize(entry->input.dtype);
  std::string thrown;
  void* output = bytes == 0 ? nullptr : AllocateOutputMemory(*entry, shape, &thrown);
  Status local;
  if (output == nullptr && bytes > 0) {
    local = InContext(NoOutputMemory(shape, thrown), "alltoall", entries);
    failed_here_.push_back(entry);
    GRADSYNC_LAUNCH(FusionBuffer(bytes, &output), "alltoall", entries);
  } else {
    entry->output = TensorView(output, entry->input.dtype, shape, entry->input.device);
    entry->state->output_shape = shape;
    entry->state->received_splits = received;
  }
  phases_.clear();
  GRADSYNC_LAUNCH(WaitForInputs(entries), "alltoall", entries);
  MarkPhase("DEVICE_QUEUE");
  GRADSYNC_LAUNCH(backend_->Alltoallv(entry->input.data, Scaled(splits, row), output,
                                      Scaled(received, row), entry->input.dtype),
                  "alltoall", entries);
  GRADSYNC_RETURN_IF_ERROR(FinishLaunch(entries, "DEVICE_ALLTOALL"));
  return local;
}

Status DevicePlane::Reducescatter(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                                  std::vector<LocalFailure>* local_failures) {
  GRADSYNC_RETURN_IF_ERROR(BeginCall());
  if (entries.empty()) return Status::OK();
  const int size = backend_->size();
  const int rank = backend_->rank();
  const ReduceOp op = CollectiveOp(spec);
  const double postscale = Postscale(spec);
  const size_t element_size = DataTypeSize(spec.dtype);
  // shares[i][r]: the elements of entry i that rank r receives.
  std::vector<std::vector<int64_t>> shares(entries.size());
  std::vector<int64_t> counts(size, 0);
  for (size_t i = 0; i < entries.size(); ++i) {
    const TensorView& input = entries[i]->input;
    if (input.dtype != spec.dtype || input.shape.empty()) {
      return InContext(Status::InvalidArgument("dtype or shape differs from the bucket's"),
                       "reducescatter", entries);
    }
    shares[i] = Scaled(EvenSplits(input.shape[0], size), RowElements(input));
    for (int r = 0; r < size; ++r) counts[r] += shares[i][r];
  }
  // Outputs first: an allocator that fails fails its tensor on this rank alone.
  std::vector<bool> allocated(entries.size(), true);
  for (size_t i = 0; i < entries.size(); ++i) {
    TensorEntry* entry = entries[i];
    const std::vector<int64_t> shape =
        WithFirstDim(entry->input.shape, EvenSplits(entry->input.shape[0], size)[rank]);
    const size_t bytes = static_cast<size_t>(shares[i][rank]) * element_size;
    std::string thrown;
    void* output = bytes == 0 ? nullptr : AllocateOutputMemory(*entry, shape, &thrown);
    if (output == nullptr && bytes > 0) {
      allocated[i] = false;
      failed_here_.push_back(entry);
      local_failures->push_back(
          {entry, InContext(NoOutputMemory(shape, thrown), "reducescatter", {entry})});
      continue;
    }
    entry->output = TensorView(output, spec.dtype, shape, entry->input.device);
    entry->state->output_shape = shape;
  }
  phases_.clear();
  GRADSYNC_LAUNCH(WaitForInputs(entries), "reducescatter", entries);
  MarkPhase("DEVICE_QUEUE");
  segments_.clear();
  if (entries.size() == 1 && spec.prescale == 1.0 && allocated[0]) {
    TensorEntry* entry = entries.front();
    GRADSYNC_LAUNCH(
        backend_->ReduceScatterv(entry->input.data, entry->output.data, counts, spec.dtype, op),
        "reducescatter", entries);
    if (postscale != 1.0 && counts[rank] > 0) {
      segments_.push_back({entry->output.data, entry->output.data, counts[rank], postscale});
      GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "reducescatter", entries);
    }
    return FinishLaunch(entries, "DEVICE_REDUCESCATTER");
  }
  // Rank-major in the fusion buffer: every tensor's share for rank 0, then for rank 1, ...; this
  // rank's result lands after them.
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  void* fusion = nullptr;
  GRADSYNC_LAUNCH(
      FusionBuffer(AlignFusionOffset(total * element_size) + counts[rank] * element_size, &fusion),
      "reducescatter", entries);
  void* result = At(fusion, 0, 1) + AlignFusionOffset(total * element_size);
  int64_t offset = 0;
  std::vector<int64_t> sent(entries.size(), 0);  // elements of entry i packed so far
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < entries.size(); ++i) {
      segments_.push_back({At(entries[i]->input.data, sent[i], element_size),
                           At(fusion, offset, element_size), shares[i][r], spec.prescale});
      sent[i] += shares[i][r];
      offset += shares[i][r];
    }
  }
  GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "reducescatter", entries);
  MarkPhase("DEVICE_COPY_IN");
  GRADSYNC_LAUNCH(backend_->ReduceScatterv(fusion, result, counts, spec.dtype, op), "reducescatter",
                  entries);
  MarkPhase("DEVICE_REDUCESCATTER");
  // This rank's result holds each tensor's share in turn.
  segments_.clear();
  int64_t result_offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (allocated[i]) {
      segments_.push_back({At(result, result_offset, element_size), entries[i]->output.data,
                           shares[i][rank], postscale});
    }
    result_offset += shares[i][rank];
  }
  GRADSYNC_LAUNCH(backend_->BatchedCopy(segments_, spec.dtype), "reducescatter", entries);
  return FinishLaunch(entries, "DEVICE_COPY_OUT");
}

#undef GRADSYNC_LAUNCH

Status DevicePlane::AdoptStandIn(TensorEntry* stand_in) {
  GRADSYNC_RETURN_IF_ERROR(Failed());
  const int64_t signed_bytes = stand_in->input.num_bytes();
  if (signed_bytes <= 0) return Status::OK();
  const auto bytes = static_cast<size_t>(signed_bytes);
  StandInMemory* slot = nullptr;
  for (StandInMemory& held : stand_ins_) {
    if (held.host == stand_in->input.data && held.bytes >= bytes) slot = &held;
  }
  if (slot == nullptr) {
    void* memory = nullptr;
    GRADSYNC_RETURN_IF_ERROR(backend_->Allocate(bytes, &memory));
    stand_ins_.push_back({stand_in->input.data, memory, bytes});
    slot = &stand_ins_.back();
  }
  // In stream order: after the last bucket that reduced into this block.
  GRADSYNC_RETURN_IF_ERROR(backend_->Upload(stand_in->input.data, slot->memory, bytes));
  stand_in->input.data = slot->memory;
  stand_in->output = stand_in->input;
  return Status::OK();
}

void DevicePlane::ReleaseStandIns() {
  for (const StandInMemory& held : stand_ins_) backend_->FreeAfterWork(held.memory);
  stand_ins_.clear();
}

}  // namespace gradsync
