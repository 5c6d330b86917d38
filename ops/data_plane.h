// DataPlane: the interface every backend (MPI for host memory; NCCL or staged MPI for device
// memory) implements, one collective per file. The background thread calls it with entries whose
// negotiation has finished, in the same order on every rank.
//
// Two kinds of plane fit it. A host plane runs each call's work inside the call: the returned
// Status is the result and TakeCompletion() gives null. A device plane returns once the work is
// queued on its communication stream: the Status says whether launching worked (or, with an
// event all the same, that an entry failed on this rank alone: see TakeCompletion), and
// TakeCompletion() gives the event that completes when the work has run. The background thread
// hands that event, with the bucket's entries, to the finalizer (coordinator/finalizer.h), which
// completes them later, and goes straight on. The host path pays one virtual call per bucket.
//
// Thread safety: the collectives and TakeCompletion are called by the background thread only;
// CheckAsyncError and Abort by the finalizer thread, concurrently with them. A non-OK Status
// fails the entries of that call only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "runtime/stream.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

// `rows` divided into `parts` as evenly as possible, lower parts taking the remainder: 10 rows in
// 4 parts are {3, 3, 2, 2}. How reducescatter divides its result, and alltoall's default splits.
std::vector<int64_t> EvenSplits(int64_t rows, int parts);
// Alltoall splits for `rows` over `size` ranks: one per rank, none negative, adding up to `rows`.
// The enqueue refuses bad splits with this; the data plane checks again before its collectives.
Status CheckSplits(const std::vector<int64_t>& splits, int64_t rows, int size);

// "allreduce of tensor 'a'", "allreduce of tensors 'a', 'b' and 3 more": a bucket, for messages,
// naming at most `max_named` tensors.
std::string DescribeBucket(const std::string& collective, const std::vector<TensorEntry*>& entries,
                           size_t max_named = 4);

// What every entry of an allreduce bucket has in common.
struct ReduceSpec {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
};

// An entry that failed on this rank alone while its collective still ran: its output allocator
// gave no memory, so its share was received into scratch and dropped. The other ranks' results,
// for it and for the rest of its bucket, are whole. On a device plane the entry completes only
// with the rest of the launch (TakeCompletion), since the device reads its input until then.
struct LocalFailure {
  TensorEntry* entry = nullptr;
  Status status;
};

class DataPlane {
 public:
  virtual ~DataPlane() = default;

  // Reduces every entry's input into its output. Several entries are packed into a fusion buffer
  // at aligned offsets, reduced with one collective, and unpacked; one entry may be reduced on its
  // own buffers where the plane's path allows. kAverage is a sum with postscale divided by the
  // number of ranks.
  virtual Status Allreduce(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) = 0;

  // Concatenates along the first dimension; first_dims[r] is rank r's first dimension. Allocates
  // the output through entry->allocator, sets entry->output and entry->state->output_shape.
  virtual Status Allgather(TensorEntry* entry, const std::vector<int64_t>& first_dims) = 0;

  // Overwrites entry->input on every rank with the root's.
  virtual Status Broadcast(TensorEntry* entry, int root) = 0;

  // Reduces every entry's input across ranks and leaves this rank's share of the result in the
  // entry's output: the first dimension is divided by EvenSplits (lower ranks take the remainder),
  // the other dimensions are kept. Outputs are allocated through entry->allocator (entry->output
  // and entry->state->output_shape are set). Several entries are packed into the fusion buffer so
  // that one collective serves them all. Scale factors and kAverage as for Allreduce. An entry
  // whose allocator fails still takes part and is appended to *local_failures; it alone fails,
  // and the returned Status covers the others.
  virtual Status Reducescatter(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                               std::vector<LocalFailure>* local_failures) = 0;

  // Sends entry->splits[r] rows of the input's first dimension to rank r, in rank order (EvenSplits
  // when splits is empty), and receives every rank's rows for this rank, concatenated in rank
  // order. The output is allocated through entry->allocator; entry->output,
  // entry->state->output_shape and entry->state->received_splits are set.
  virtual Status Alltoall(TensorEntry* entry) = 0;

  // A joined rank's stand-in: an entry whose input, in host memory, holds the identity of its
  // reduce op. A device plane moves it to memory of its own (input and output point there after)
  // and keeps that until ReleaseStandIns(); host planes leave it as it is.
  virtual Status AdoptStandIn(TensorEntry* stand_in) {
    (void)stand_in;
    return Status::OK();
  }
  // Called once every rank has joined and no work that used a stand-in is in flight.
  virtual void ReleaseStandIns() {}

  // After a call: null where the call launched nothing (host planes, and a call that failed
  // before launching) or failed while launching (the plane is then aborted), or the event that
  // completes, OK or failed, once its work has run.
  // A call that failed on this rank alone after launching (an output its allocator gave no memory
  // for, while the other ranks were committed) still gives its event: until then the work reads
  // the entry's input. Each call's event is taken once.
  virtual std::shared_ptr<StreamEvent> TakeCompletion() { return nullptr; }

  // Device planes, for the timeline: while on, each launch records its phases on the stream (the
  // wait for the inputs and for earlier work, the copy in, the collective, the copy out), each
  // ended by a timed event (Stream::RecordTimed), and TakePhases() gives them with the completion.
  struct TimedPhase {
    const char* label;  // "DEVICE_QUEUE", "DEVICE_COPY_IN", "DEVICE_ALLREDUCE", ...
    std::shared_ptr<StreamEvent> end;
  };
  virtual void RecordPhases(bool on) { (void)on; }
  virtual std::vector<TimedPhase> TakePhases() { return {}; }

  // How long launched work may run before the finalizer gives up on it and calls Abort().
  virtual std::chrono::nanoseconds completion_timeout() const {
    return std::chrono::nanoseconds::max();
  }
  // Errors the backend reports on its own, apart from any one call (NCCL's asynchronous errors):
  // polled while work is in flight; a non-OK result is handed to Abort().
  virtual Status CheckAsyncError() { return Status::OK(); }
  // Stops the plane: work in flight is abandoned and its completion events fail with `status`,
  // and every later call fails with it too. For work that did not finish in time or a backend
  // that reported an error; idempotent (the first status is kept).
  virtual void Abort(const Status& status) { (void)status; }
};

}  // namespace gradsync
