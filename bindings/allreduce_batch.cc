// AllreduceBatch (gradsync.h): the buckets are fixed at construction, so that starting a batched
// tensor costs a pointer and a counter, and a bucket is one operation whose pieces are its members'
// own memory (TensorEntry::segments): the data plane copies them into its fusion buffer or node
// shared memory and back, as it would separate tensors, with no copy of the batch's own.
#include <gradsync/gradsync.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <unordered_set>
#include <utility>

#include "bindings/runtime.h"
#include "ops/mpi/caller_allreduce.h"
#include "runtime/caller_lanes.h"
#include "runtime/logging.h"
#include "runtime/steady_seconds.h"

namespace gradsync {

namespace {

// Batches made with generated names, in this process; the same on every rank when every rank makes
// its batches in the same order, as the names require anyway.
std::atomic<uint64_t> unnamed_batches{0};

Status InvalidBatch(const std::string& what) {
  return Status::InvalidArgument("AllreduceBatch: " + what);
}

// An in-place host allreduce of a one-dimensional tensor kept in `count` pieces (see
// TensorEntry::segments), which stay valid and untouched until the handle completes.
Handle AllreducePieces(DataType dtype, const HostSegment* pieces, size_t count,
                       const AllreduceOptions& options) {
  Runtime& rt = ActiveRuntime("AllreduceBatch");
  int64_t elements = 0;
  for (size_t i = 0; i < count; ++i) elements += pieces[i].elements;
  auto entry = NewEntry(rt, OpType::kAllreduce, options.name, options.on_complete);
  // Validated as a whole tensor at a stand-in address, then dropped: the data plane reads and
  // writes the pieces only.
  static char stand_in;
  const TensorView whole(&stand_in, dtype, {elements});
  const Status status = FillAllreduce(rt, whole, whole, options, entry.get());
  entry->input.data = nullptr;
  entry->output.data = nullptr;
  entry->segments = pieces;
  entry->segment_count = count;
  return Submit(rt, std::move(entry), status);
}

}  // namespace

struct AllreduceBatch::Impl {
  struct Bucket {
    DataType dtype = DataType::kFloat32;
    size_t bytes = 0;
    AllreduceOptions options;              // named after its first and last members
    std::vector<size_t> members;           // slot indices, in list order
    std::vector<HostSegment> pieces;       // one per member: its memory, or zeros in `unstarted`
    std::vector<unsigned char> unstarted;  // zeros for members not started in a step; lazily
    size_t started = 0;
    bool enqueued = false;
    Handle handle;
    std::optional<Error> refused;  // the enqueue threw
  };
  struct Slot {
    TensorView view;           // data set at start()
    AllreduceOptions options;  // named; alone-reduced slots only
    size_t bytes = 0;
    size_t offset = 0;  // bytes into its bucket
    Handle handle;      // reduced alone, while in flight
  };
  // What start() and a step's end read and write for each slot, kept apart from the Slot (a few
  // hundred bytes with its name and shape), so that a step of a thousand small tensors walks
  // 12 bytes a tensor.
  struct SlotState {
    int32_t bucket = -1;  // -1: reduced alone
    uint32_t piece = 0;   // its index in the bucket's pieces
    bool started = false;
  };

  std::vector<Slot> slots;
  std::vector<SlotState> states;  // one per slot
  std::vector<Bucket> buckets;
  std::vector<size_t> started;  // slot indices since the last wait, in start order
  // Device reductions a synchronize_stream() ordered on a stream rather than waited for; the next
  // step reports those that failed, and keeps those still running for a later one.
  std::vector<Handle> ordered_on_device;

  // The last bucket's lane (runtime/caller_lanes.h), when it can have one (sum or average), and
  // the table it is registered in (that of the runtime of the latest step; null before one).
  int lane_bucket = -1;
  CallerLane lane;
  std::shared_ptr<CallerLaneTable> lane_table;
  std::vector<unsigned char> lane_staging;
  uint64_t caller_reductions = 0;

  // `reduction`: the options every bucket shares but its name.
  void Layout(const AllreduceOptions& reduction);
  // Registers the lane with `rt`'s table, where it is not yet; called as a step starts.
  void RegisterLane(Runtime& rt);
  void ForgetLane();
  // Whether `bucket` is reduced by wait() on its lane this step rather than negotiated.
  bool OnLane(const Bucket& bucket) const;
  void Enqueue(Bucket* bucket);
  void Start(size_t index, void* data, const DeviceReadiness* ready);
  // Keeps the first failure of the device reductions the last step left ordered on a stream.
  void NoteOrderedFailures(std::optional<Error>* first_failure);
  // wait() and synchronize_stream(): with `order_on` set, device slots are ordered on it.
  void FinishStep(bool order_device_slots, void* order_on);
  // Reduces the lane's bucket on the calling thread; a failure is kept in *first_failure.
  void ReduceOnLane(Bucket* bucket, std::optional<Error>* first_failure);
  // `order_device_slots`: device slots' reductions are ordered on `order_on` instead of waited.
  void Finish(std::optional<Error>* first_failure, bool order_device_slots = false,
              void* order_on = nullptr);
};

// Buckets are made in list order, one open per dtype: a trainer lists its tensors in the order
// backward produces them, so a bucket's members are ready close together.
void AllreduceBatch::Impl::Layout(const AllreduceOptions& reduction) {
  struct Open {
    int bucket = -1;
    size_t span_start = 0;  // bytes of the list before the bucket's first member
  };
  std::vector<Open> open(kNumDataTypes);
  size_t listed = 0;  // bytes of the list so far
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& slot = slots[i];
    // An Adasum bucket of one entry would weigh its members as one tensor: each goes alone.
    const bool batched = slot.view.device.kind == DeviceKind::kCpu &&
                         slot.bytes < kBatchedBelowBytes && reduction.op != ReduceOp::kAdasum;
    if (batched) {
      Open& current = open[static_cast<int>(slot.view.dtype)];
      if (current.bucket >= 0) {
        const Bucket& b = buckets[static_cast<size_t>(current.bucket)];
        if (b.bytes + slot.bytes > kBucketBytes ||
            listed + slot.bytes - current.span_start > kBucketSpanBytes) {
          current.bucket = -1;
        }
      }
      if (current.bucket < 0) {
        current.bucket = static_cast<int>(buckets.size());
        current.span_start = listed;
        buckets.emplace_back();
      }
      Bucket& bucket = buckets[static_cast<size_t>(current.bucket)];
      states[i].bucket = current.bucket;
      states[i].piece = static_cast<uint32_t>(bucket.members.size());
      slot.offset = bucket.bytes;
      bucket.bytes += slot.bytes;
      bucket.members.push_back(i);
      bucket.pieces.push_back({nullptr, slot.view.num_elements()});
    }
    listed += slot.bytes;
  }
  if (!buckets.empty() && (reduction.op == ReduceOp::kSum || reduction.op == ReduceOp::kAverage)) {
    lane_bucket = static_cast<int>(buckets.size()) - 1;
  }
  for (Bucket& bucket : buckets) {
    const Slot& first = slots[bucket.members.front()];
    const Slot& last = slots[bucket.members.back()];
    bucket.dtype = first.view.dtype;
    bucket.options = reduction;
    bucket.options.name = "bucket(" + first.options.name +
                          (bucket.members.size() > 1 ? ".." + last.options.name : "") + ")";
  }
}

void AllreduceBatch::Impl::RegisterLane(Runtime& rt) {
  if (lane_bucket < 0 || lane_table == rt.lanes) return;
  ForgetLane();
  lane_table = rt.lanes;
  lane_table->Add(&lane);
}

void AllreduceBatch::Impl::ForgetLane() {
  if (lane_table != nullptr) lane_table->Remove(&lane);
  ReleaseLaneComm(&lane);
  lane.failed = false;
  lane_table.reset();
}

bool AllreduceBatch::Impl::OnLane(const Bucket& bucket) const {
  return lane_bucket >= 0 && &bucket == &buckets[static_cast<size_t>(lane_bucket)] &&
         lane.comm.load(std::memory_order_relaxed) != MPI_COMM_NULL;
}

void AllreduceBatch::Impl::ReduceOnLane(Bucket* bucket, std::optional<Error>* first_failure) {
  bucket->started = 0;
  // A process set that failed or went away fails the bucket with its reason, as it fails an
  // enqueue.
  Runtime& rt = ActiveRuntime("AllreduceBatch::wait");
  int set_rank = 0, set_size = 0;
  const Status member =
      rt.registry.Membership(bucket->options.process_set.id(), &set_rank, &set_size);
  if (!member.ok()) {
    if (!*first_failure) *first_failure = Error(member);
    return;
  }
  const LaneReduction reduction{bucket->dtype, bucket->options.op, bucket->options.prescale,
                                bucket->options.postscale};
  bool flagged = false;
  const bool traced = rt.timeline.active();
  if (traced) rt.timeline.ActivityStart(bucket->options.name, "CALLER_ALLREDUCE");
  lane.entered_seconds.store(SteadySeconds(), std::memory_order_relaxed);
  const Status status = AllreduceOnLane(
      bucket->pieces.data(), bucket->pieces.size(), reduction, /*flag=*/false,
      lane.comm.load(std::memory_order_relaxed), lane.piece_bytes,
      "allreduce of " + bucket->options.name + " on its caller's thread", &lane_staging, &flagged);
  lane.entered_seconds.store(0.0, std::memory_order_relaxed);
  if (traced) rt.timeline.ActivityEnd(bucket->options.name);
  if (!status.ok()) {
    lane.failed = true;
    ReleaseLaneComm(&lane);
    if (!*first_failure) *first_failure = Error(status);
    return;
  }
  ++caller_reductions;
  if (!flagged) return;
  // A rank has joined: the bucket goes back to negotiation, where its stand-ins take part. The
  // joining rank's join went out in a round before it took part here; one more whole round keeps
  // a join() this rank calls next from arriving in that same round, so the rank that joins last
  // is still the one that called join() last.
  ReleaseLaneComm(&lane);
  rt.loop->WaitForFreshCycle();
}

void AllreduceBatch::Impl::Enqueue(Bucket* bucket) {
  bucket->enqueued = true;
  try {
    bucket->handle = AllreducePieces(bucket->dtype, bucket->pieces.data(), bucket->pieces.size(),
                                     bucket->options);
  } catch (const Error& e) {
    bucket->refused = e;
    throw;
  }
}

// Waits for everything started since the last wait and writes the buckets' results back; the
// first failure is kept, the rest only waited for.
void AllreduceBatch::Impl::Finish(std::optional<Error>* first_failure, bool order_device_slots,
                                  void* order_on) {
  auto note = [&](const Error& e) {
    if (!*first_failure) *first_failure = e;
  };
  for (Bucket& bucket : buckets) {
    if (!bucket.enqueued) continue;
    if (bucket.refused) {
      note(*bucket.refused);
    } else {
      try {
        bucket.handle.wait();
      } catch (const Error& e) {
        note(e);
      }
    }
    bucket.handle = Handle();
    bucket.refused.reset();
    bucket.enqueued = false;
    bucket.started = 0;
  }
  const size_t ordered_before = ordered_on_device.size();
  for (size_t i : started) {
    states[i].started = false;
    if (states[i].bucket >= 0) continue;
    Slot& slot = slots[i];
    if (slot.handle.valid()) {
      if (order_device_slots && slot.view.device.kind != DeviceKind::kCpu) {
        ordered_on_device.push_back(std::move(slot.handle));
      } else {
        try {
          slot.handle.wait();
        } catch (const Error& e) {
          note(e);
        }
      }
      slot.handle = Handle();
    }
  }
  started.clear();
  // Nothing to order (a host step, or one the destructor finishes on any thread): no call, which
  // would refuse a gradsync thread.
  if (ordered_on_device.size() == ordered_before) return;
  // Together: the device plane fuses slots into buckets that share one completion. A slot that
  // failed is reported now and cleared, so that the next step reports only what fails later.
  OrderStreamAfterHandles(ordered_on_device.data() + ordered_before,
                          ordered_on_device.size() - ordered_before, order_on,
                          "AllreduceBatch::synchronize_stream", [&](size_t i, const Error& e) {
                            note(e);
                            ordered_on_device[ordered_before + i] = Handle();
                          });
}

AllreduceBatch::AllreduceBatch(const std::vector<TensorView>& tensors,
                               const AllreduceBatchOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (!options.names.empty() && options.names.size() != tensors.size()) {
    Throw(InvalidBatch(std::to_string(tensors.size()) + " tensors but " +
                       std::to_string(options.names.size()) + " names"));
  }
  const uint64_t batch = options.names.empty() ? unnamed_batches++ : 0;
  AllreduceOptions reduction;
  reduction.op = options.op;
  reduction.prescale = options.prescale;
  reduction.postscale = options.postscale;
  reduction.process_set = options.process_set;
  std::unordered_set<std::string> seen;
  impl_->slots.resize(tensors.size());
  impl_->states.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    Impl::Slot& slot = impl_->slots[i];
    slot.view = tensors[i];
    slot.view.data = nullptr;
    const int64_t bytes = slot.view.num_bytes();
    if (bytes < 0) Throw(InvalidBatch("tensor " + std::to_string(i) + " has an invalid shape"));
    slot.bytes = static_cast<size_t>(bytes);
    std::string name = options.names.empty()
                           ? "batch" + std::to_string(batch) + "." + std::to_string(i)
                           : options.names[i];
    if (name.empty()) Throw(InvalidBatch("tensor " + std::to_string(i) + " has an empty name"));
    if (!seen.insert(name).second) Throw(InvalidBatch("the name '" + name + "' is listed twice"));
    slot.options = reduction;
    slot.options.name = std::move(name);
    slot.options.ready = options.ready;
  }
  impl_->Layout(reduction);
  impl_->started.reserve(tensors.size());
  if (impl_->lane_bucket >= 0) {
    const Impl::Bucket& last = impl_->buckets[static_cast<size_t>(impl_->lane_bucket)];
    CallerLane& lane = impl_->lane;
    lane.name = last.options.name;
    lane.process_set = options.process_set.id();
    lane.dtype = last.dtype;
    for (const HostSegment& piece : last.pieces) lane.elements += piece.elements;
  }
}

AllreduceBatch::~AllreduceBatch() {
  if (!impl_) return;
  if (!impl_->started.empty()) {
    std::optional<Error> dropped;
    impl_->Finish(&dropped);
  }
  impl_->ForgetLane();
}

AllreduceBatch::AllreduceBatch(AllreduceBatch&&) noexcept = default;

AllreduceBatch& AllreduceBatch::operator=(AllreduceBatch&& other) noexcept {
  if (this != &other) {
    if (impl_ && !impl_->started.empty()) {
      std::optional<Error> dropped;
      impl_->Finish(&dropped);
    }
    if (impl_) impl_->ForgetLane();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void AllreduceBatch::Impl::NoteOrderedFailures(std::optional<Error>* first_failure) {
  // Never blocks: one still running has not failed yet, and is kept for a later step to report
  // (the host routinely runs a step ahead of the device).
  auto settled = [&](const Handle& h) {
    if (!h.valid()) return true;
    if (!h.poll()) return false;
    if (!*first_failure && !h.status().ok()) *first_failure = Error(h.status());
    return true;
  };
  ordered_on_device.erase(
      std::remove_if(ordered_on_device.begin(), ordered_on_device.end(), settled),
      ordered_on_device.end());
}

void AllreduceBatch::start(size_t index, void* data) { impl_->Start(index, data, nullptr); }

void AllreduceBatch::start(size_t index, void* data, const DeviceReadiness& ready) {
  impl_->Start(index, data, &ready);
}

void AllreduceBatch::Impl::Start(size_t index, void* data, const DeviceReadiness* ready) {
  if (index >= slots.size()) {
    Throw(InvalidBatch("no tensor " + std::to_string(index) + " in a batch of " +
                       std::to_string(slots.size())));
  }
  Impl::SlotState& state = states[index];
  if (state.started)
    Throw(InvalidBatch("tensor '" + slots[index].options.name + "' started twice before wait()"));
  if (started.empty()) RegisterLane(ActiveRuntime("AllreduceBatch::start"));
  if (state.bucket < 0) {
    Impl::Slot& slot = slots[index];
    slot.view.data = data;
    if (ready == nullptr) {
      slot.handle = allreduce(slot.view, slot.options);
    } else {
      // Lent to this start only, without copying the options (and their name) per gradient.
      struct Restore {
        DeviceReadiness* at;
        DeviceReadiness kept;
        ~Restore() { *at = kept; }
      } restore{&slot.options.ready, slot.options.ready};
      slot.options.ready = *ready;
      slot.handle = allreduce(slot.view, slot.options);
    }
    state.started = true;
    started.push_back(index);
    return;
  }
  Impl::Bucket& bucket = buckets[static_cast<size_t>(state.bucket)];
  bucket.pieces[state.piece].data = data;
  state.started = true;
  started.push_back(index);
  // A bucket on its lane waits for wait(), which reduces it on this thread.
  if (++bucket.started == bucket.members.size() && !OnLane(bucket)) Enqueue(&bucket);
}

void AllreduceBatch::wait() {
  RequireCallerThread("AllreduceBatch::wait");
  impl_->FinishStep(false, nullptr);
}

void AllreduceBatch::synchronize_stream(void* cuda_stream) {
  RequireCallerThread("AllreduceBatch::synchronize_stream");
  impl_->FinishStep(true, cuda_stream);
}

void AllreduceBatch::Impl::FinishStep(bool order_device_slots, void* order_on) {
  std::optional<Error> first_failure;
  NoteOrderedFailures(&first_failure);
  if (started.empty()) {
    if (first_failure) throw *first_failure;
    return;
  }
  Impl::Bucket* on_lane = nullptr;
  for (Impl::Bucket& bucket : buckets) {
    if (bucket.enqueued) continue;
    // Each unstarted member gets its own zeros: a reduction may write one member's result while
    // still reading a later member's input.
    if (bucket.started < bucket.members.size()) {
      if (bucket.unstarted.size() < bucket.bytes) bucket.unstarted.resize(bucket.bytes);
      for (size_t i : bucket.members) {
        if (states[i].started) continue;
        const Impl::Slot& slot = slots[i];
        unsigned char* zeros = bucket.unstarted.data() + slot.offset;
        if (slot.bytes > 0) std::memset(zeros, 0, slot.bytes);
        bucket.pieces[states[i].piece].data = zeros;
      }
    }
    if (OnLane(bucket)) {
      on_lane = &bucket;
      continue;
    }
    try {
      Enqueue(&bucket);
    } catch (const Error&) {
      // Kept in the bucket: Finish reports it.
    }
  }
  // While the background thread runs the rest.
  if (on_lane != nullptr) ReduceOnLane(on_lane, &first_failure);
  Finish(&first_failure, order_device_slots, order_on);
  if (first_failure) throw *first_failure;
}

size_t AllreduceBatch::size() const { return impl_ ? impl_->slots.size() : 0; }

size_t AllreduceBatch::in_flight() const { return impl_ ? impl_->started.size() : 0; }

size_t AllreduceBatch::bucket_count() const { return impl_ ? impl_->buckets.size() : 0; }

uint64_t AllreduceBatch::caller_reductions() const { return impl_ ? impl_->caller_reductions : 0; }

}  // namespace gradsync
