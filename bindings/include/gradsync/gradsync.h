// gradsync public C++ API: negotiated, fused gradient synchronization over MPI.
//
// Every collective is enqueued from any thread and returns a Handle at once; a background thread
// agrees with the other ranks on what is ready, fuses, executes and completes the handle. Failures
// are reported as gradsync::Error (a std::runtime_error carrying a Status): at enqueue for bad
// input, at wait for a failed collective.
//
// Thread safety: init() and shutdown() must not race with each other or with any other call
// (waits and queries of the rank or a process set included: shutdown frees what they read);
// everything else may be called from any thread. Output allocators run on gradsync's background
// thread; completion callbacks run there too, or, for device tensors, on its finalizer thread (or
// inside the enqueue that launches a locked bucket, GRADSYNC_CALLER_LAUNCH); both run before the
// handle reports completion: keep them short. The calls that block on those threads
// (Handle::wait, wait_for and synchronize_stream, init, shutdown, join, add_process_set and
// remove_process_set) throw InvalidArgument when made inside one instead of deadlocking; poll(),
// status() and enqueues are fine there. An exception a callback throws is logged and dropped.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"

namespace gradsync {

class OpState;

// The exception the C++ API throws; status() tells the code and the full message.
class Error : public std::runtime_error {
 public:
  explicit Error(Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const Status& status() const { return status_; }
  StatusCode code() const { return status_.code(); }

 private:
  Status status_;
};

// A process set: a subset of the ranks that runs collectives among itself, with its own
// communicators, negotiation, response cache, stall inspector and fusion buffer, all served by the
// one background thread. Inside a set, ranks are numbered 0..size()-1 in ascending global rank:
// alltoall splits and the order of allgather and reducescatter results use these numbers, while a
// broadcast's root is a global rank (a member of the set), as in Horovod. The global set (id 0,
// every rank) always exists and is what every collective uses by default. A ProcessSet is a small
// value naming a set by id; it stays valid to copy after the set is removed, but collectives on it
// then fail.
class ProcessSet {
 public:
  ProcessSet() = default;  // the global set
  int id() const { return id_; }
  // The members' global ranks, ascending. Throws Error if the set does not exist (any more).
  std::vector<int> ranks() const;
  int size() const;
  // This process's rank within the set, or -1 when it is not a member.
  int rank() const;
  bool included() const { return rank() >= 0; }
  bool operator==(const ProcessSet& other) const { return id_ == other.id_; }
  bool operator!=(const ProcessSet& other) const { return id_ != other.id_; }

 private:
  friend ProcessSet MakeProcessSet(int id);
  int id_ = 0;
};

struct InitOptions {
  MPI_Comm comm = MPI_COMM_WORLD;
  // Process sets to create at init, each a list of global ranks; they get ids 1, 2, ... in this
  // order. Every rank must pass the same lists.
  std::vector<std::vector<int>> process_sets;
};

// Starts gradsync on `comm` (MPI_COMM_WORLD by default), initializing MPI if the application has
// not (and then finalizing it at shutdown). Collective over `comm`. Reads GRADSYNC_* variables.
void init(MPI_Comm comm = MPI_COMM_WORLD);
// As above, and creates the listed process sets.
void init(const InitOptions& options);
// Fails every pending operation with a Shutdown error, stops the background thread and frees
// gradsync's communicators. Every rank should call it; a no-op when not initialized.
void shutdown();
bool is_initialized();

// Whether this build reduces CUDA tensors, and the NCCL version it was built with (NCCL's code:
// 22800 for 2.28.0; 0 without NCCL). Callable at any time, before init() too.
bool cuda_built();
int nccl_version();

// Device memory for a collective's output where the caller has no allocator of its own (a
// framework-free binding, say): cudaMalloc on CUDA device `device`, returned with
// free_device_memory, which waits for the device's work on it. An Allocator for a device input
// must return memory on that input's device; this is one way to get it. Both throw Error
// (Unsupported in a build without CUDA, CudaError when CUDA fails).
void* allocate_device_memory(int device, size_t bytes);
void free_device_memory(int device, void* data);

int rank();
int size();
int local_rank();  // rank among the processes on this node
int local_size();
// Rank among the processes that share this local rank, and their number: the node index and the
// node count when every node runs the same number of processes.
int cross_rank();
int cross_size();
// The GPU (CUDA device index among the visible ones) init() picked for this rank: the local rank
// modulo the visible GPUs, or GRADSYNC_GPU_DEVICE; -1 where no GPU is usable. gradsync binds its
// background thread near it; put the model there too (torch.cuda.set_device(gpu_device())).
int gpu_device();

// Timeline: rank 0 writes a Chrome trace / Perfetto JSON file with a row per tensor (queueing,
// negotiation with a mark as each rank's request arrives, copies into and out of the fusion buffer,
// the collective) and a marker per background cycle. GRADSYNC_TIMELINE=<file> starts one at init();
// these start and stop one at run time. The file is valid JSON once stopped (shutdown() stops it).
// Starting while one is written throws; on ranks other than 0 both calls do nothing.
void start_timeline(const std::string& path);
void stop_timeline();

// Process sets at run time. Both calls are collective over every rank (members or not), must be
// made in the same order everywhere with the same arguments, and block until done. Adding returns
// the new set; a list that is empty, holds a rank twice or out of range, or equals an existing
// set's is refused. Removing fails the set's pending operations with a Shutdown error; the global
// set cannot be removed.
ProcessSet add_process_set(const std::vector<int>& ranks);
void remove_process_set(const ProcessSet& process_set);
// Every existing set, the global one first.
std::vector<ProcessSet> process_sets();

// Join, for ranks with uneven amounts of data: a rank that has run out calls join(), which blocks
// until every rank has joined and returns the rank that joined last. Until then the joined rank
// takes part in the other ranks' allreduces with the identity of their reduce op (zeros for sum
// and average; average still divides by the number of all ranks) and in their barriers, so they
// neither hang nor get wrong sums. Allgather, broadcast, alltoall and reducescatter cannot run
// while a rank that did not submit them has joined: they fail on every rank with an error naming
// the joined ranks. Join works on the global set; collective over every rank.
int join();

using CompletionCallback = std::function<void(const Status&)>;

// Device tensors whose producer is still running: gradsync's communication stream waits for the
// producer on the device, so neither the caller nor gradsync's threads block on it. Give the
// producer's stream (a cudaStream_t: gradsync records an event on it at enqueue, or, while the
// process set is locked, once per bucket when the bucket is launched; it must stay valid until the
// operation is launched), or an event (a cudaEvent_t the caller recorded after the producing
// work, and does not record again until the operation is launched, which wait() or
// synchronize_stream() assure). Opaque handles, so that this header needs no CUDA headers. Both
// null (the default): the input is ready at enqueue; so the legacy default stream, whose handle is
// null, is given as cudaStreamLegacy. Ignored for host tensors.
struct DeviceReadiness {
  void* cuda_stream = nullptr;
  void* cuda_event = nullptr;
};

// The result of one enqueued collective. Copyable; copies share the same operation.
class Handle {
 public:
  Handle() = default;

  // Blocks until the operation finishes; throws Error if it failed.
  void wait() const;
  // Waits at most `timeout`; returns false if still running, throws Error if it failed.
  bool wait_for(std::chrono::nanoseconds timeout) const;
  // True once the operation has finished, successfully or not. Never blocks.
  bool poll() const;
  // The final status once finished; OK while pending.
  Status status() const;
  // Allgather, reducescatter, alltoall: the output's shape, once finished.
  std::vector<int64_t> output_shape() const;
  // Alltoall: the rows received from each rank, in rank order, once finished.
  std::vector<int64_t> received_splits() const;
  // Stream-ordered completion for device tensors: work given to `cuda_stream` (a cudaStream_t)
  // after this call runs after the operation, ordered on the device (as DDP orders its next
  // kernels after its communication stream). Blocks the host only until the operation is launched
  // (its negotiation done), never until it has run; with the MPI device backend, and for host
  // tensors, it waits on the host until the operation finishes; so it does for a null stream
  // (give the legacy default stream as cudaStreamLegacy). Throws Error if the operation failed
  // before launch, or if its work is known to have failed.
  void synchronize_stream(void* cuda_stream) const;
  bool valid() const { return state_ != nullptr; }

 private:
  friend Handle MakeHandle(std::shared_ptr<OpState> state);
  friend void OrderStreamAfterHandles(const Handle* handles, size_t count, void* cuda_stream,
                                      const char* call,
                                      const std::function<void(size_t, const Error&)>& failed);
  std::shared_ptr<OpState> state_;
};

// Handle::synchronize_stream for each of `handles`, ordering `cuda_stream` once for each distinct
// completion: the members of a fused bucket complete together, so a step's gradients cost one
// stream wait a bucket rather than one a gradient. Orders after every operation it can, then
// throws the first failure.
void synchronize_stream(const std::vector<Handle>& handles, void* cuda_stream);

struct AllreduceOptions {
  std::string name;  // unique while in flight; generated when empty
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;   // applied to the input before reducing
  double postscale = 1.0;  // applied to the result (average folds 1/size in as well)
  CompletionCallback on_complete;
  ProcessSet process_set;  // the global set by default
  DeviceReadiness ready;   // device tensors: when the producer is done
};

// Reduces `tensor` across ranks in place.
Handle allreduce(const TensorView& tensor, const AllreduceOptions& options = {});
// Reduces `input` across ranks into `output` (same dtype, shape and device; may alias `input`).
Handle allreduce(const TensorView& input, const TensorView& output,
                 const AllreduceOptions& options = {});

// Receives the output's shape and dtype on the background thread once they are known; returns
// memory for the result, on the input's device (host memory for a host input, device memory on
// the same GPU for a device input), that stays valid until the handle completes, or nullptr to
// fail the operation; an exception it throws fails the operation the same way. May return nullptr
// for an output of zero bytes.
using Allocator = std::function<void*(const std::vector<int64_t>& shape, DataType dtype)>;

struct AllgatherOptions {
  std::string name;
  CompletionCallback on_complete;
  ProcessSet process_set;  // the global set by default
  DeviceReadiness ready;   // device tensors: when the producer is done
};

// Concatenates every rank's `input` along the first dimension, in rank order. Ranks may differ in
// the first dimension only. The output is placed in memory from `allocate`.
Handle allgather(const TensorView& input, Allocator allocate, const AllgatherOptions& options = {});

struct BroadcastOptions {
  std::string name;
  CompletionCallback on_complete;
  ProcessSet process_set;  // the global set by default
  DeviceReadiness ready;   // device tensors: when the producer is done
};

// Overwrites `tensor` on every rank with the root's. `root` is a global rank, also in a process
// set (where it must be a member).
Handle broadcast(const TensorView& tensor, int root, const BroadcastOptions& options = {});

struct ReducescatterOptions {
  std::string name;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  CompletionCallback on_complete;
  ProcessSet process_set;  // the global set by default
  DeviceReadiness ready;   // device tensors: when the producer is done
};

// Reduces `input` (same shape on every rank, at least one dimension) across ranks and leaves each
// rank a slice of the result along the first dimension: rows are divided as evenly as possible,
// lower ranks taking the remainder (10 rows on 4 ranks: 3, 3, 2, 2). The output, of shape
// [this rank's rows, input dims after the first], is placed in memory from `allocate`. Fused with
// other reducescatters like allreduce. When `allocate` gives no memory on one rank, only that
// tensor fails, and only on that rank: the rank still sends its input, so the other ranks' shares
// and the tensors fused with it are whole.
Handle reducescatter(const TensorView& input, Allocator allocate,
                     const ReducescatterOptions& options = {});

struct AlltoallOptions {
  std::string name;
  // Rows of the first dimension sent to each rank, in rank order: size() entries, non-negative,
  // adding up to the first dimension. Empty: the same number of rows to every rank, refused unless
  // the first dimension divides by the number of ranks (as Horovod does).
  std::vector<int64_t> splits;
  CompletionCallback on_complete;
  ProcessSet process_set;  // the global set by default
  DeviceReadiness ready;   // device tensors: when the producer is done
};

// Sends consecutive slices of `input` (at least one dimension) along the first dimension to each
// rank and receives each rank's slice for this one, concatenated in rank order. Ranks may differ in
// the first dimension only. The output is placed in memory from `allocate`; the handle's
// received_splits() says how many rows came from each rank.
Handle alltoall(const TensorView& input, Allocator allocate, const AlltoallOptions& options = {});

// Grouped variants: the tensors of one call are enqueued atomically (all accepted or none),
// negotiated together and executed in the same cycle, never split across cycles; they fuse as the
// single-tensor calls do. `names` holds one name per tensor, or is empty for generated names. One
// handle per tensor, in order. An empty group enqueues nothing.
struct GroupedAllreduceOptions {
  std::vector<std::string> names;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  ProcessSet process_set;
  DeviceReadiness ready;  // device tensors: when the producer is done
};
// Reduces every tensor in place.
std::vector<Handle> grouped_allreduce(const std::vector<TensorView>& tensors,
                                      const GroupedAllreduceOptions& options = {});

struct GroupedAllgatherOptions {
  std::vector<std::string> names;
  ProcessSet process_set;
  DeviceReadiness ready;  // device tensors: when the producer is done
};
// allgather() of every input; allocators[i] provides input i's output.
std::vector<Handle> grouped_allgather(const std::vector<TensorView>& inputs,
                                      std::vector<Allocator> allocators,
                                      const GroupedAllgatherOptions& options = {});

struct GroupedReducescatterOptions {
  std::vector<std::string> names;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  ProcessSet process_set;
  DeviceReadiness ready;  // device tensors: when the producer is done
};
// reducescatter() of every input; allocators[i] provides input i's output.
std::vector<Handle> grouped_reducescatter(const std::vector<TensorView>& inputs,
                                          std::vector<Allocator> allocators,
                                          const GroupedReducescatterOptions& options = {});

// A fixed list of tensors, such as a model's gradients, each reduced in place once per step: a
// trainer starts each one as soon as it is ready (from backward's hooks) and waits for all of them
// once. This is how gradsync.torch's DistributedOptimizer reduces gradients, and the cheapest way
// to reduce many small tensors:
// - A host tensor smaller than kBatchedBelowBytes belongs to a bucket it shares with its
//   neighbours in the list (of its dtype); once every member of a bucket has started, the bucket
//   is reduced as one operation over the members' own memory, copied into a fusion buffer and back
//   as separate tensors' would be. Such tensors then cost their copies, not an operation each to
//   negotiate, plan and complete. A bucket holds at most kBucketBytes and spans at most
//   kBucketSpanBytes of the list (its members and the larger tensors between them), so that
//   buckets close, and reduce, while backward still runs.
// - Larger and device tensors are reduced on their own, as allreduce() would, from start().
// - From the second step on, the last bucket is reduced in wait() by the calling thread itself,
//   with no negotiation and no hand-off to the background thread: the step's final reduction,
//   which nothing overlaps, then costs what a hand-written MPI_Allreduce of it would
//   (GRADSYNC_CALLER_REDUCE=0 turns this off; docs/architecture.md, "Caller-reduced buckets").
//   A rank that joins takes part once, and the bucket goes back to negotiation until everyone
//   has joined. A rank that waits there for one that never comes is reported after
//   GRADSYNC_STALL_WARNING_SECONDS, and the job aborts after GRADSYNC_STALL_SHUTDOWN_SECONDS.
// wait() reduces every bucket not yet complete, its members not started contributing zeros (as
// DDP treats unused parameters) and getting no result, so that the ranks reduce the same buckets
// whatever each started; a rank that started nothing since its last wait() reduces nothing. Every
// rank must list the same tensors (names, dtypes, shapes, devices) in the same order, and start at
// least one of them in a step when any rank does; a rank that does not is reported by the stall
// inspector, naming the bucket.
//
// Thread safety: not thread-safe; calls must not overlap (hooks serialized by the caller).
struct AllreduceBatchOptions {
  std::vector<std::string> names;  // one per tensor, unique; generated when empty
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  ProcessSet process_set;
  DeviceReadiness ready;  // device tensors: when the producer is done, at each start()
};
class AllreduceBatch {
 public:
  static constexpr size_t kBatchedBelowBytes = 64 << 10;
  static constexpr size_t kBucketBytes = 4 << 20;
  static constexpr size_t kBucketSpanBytes = 25 << 20;

  // `tensors` give each tensor's dtype, shape and device; their data pointers are not used.
  // Throws InvalidArgument for duplicate or missing names and for invalid shapes.
  AllreduceBatch(const std::vector<TensorView>& tensors, const AllreduceBatchOptions& options = {});
  // Waits for whatever is still in flight, dropping its errors.
  ~AllreduceBatch();
  AllreduceBatch(AllreduceBatch&&) noexcept;
  AllreduceBatch& operator=(AllreduceBatch&&) noexcept;

  // Starts reducing tensor `index` in place at `data`, which stays valid and untouched by the
  // caller until wait() returns. Throws Error for an index out of range or started twice before
  // wait(), and as allreduce() does.
  void start(size_t index, void* data);
  // The same for a device tensor whose producer may still be running: `ready` overrides the
  // batch's readiness for this start, so that a hook passes the stream current where backward
  // produced the gradient and never waits for it on the host.
  void start(size_t index, void* data, const DeviceReadiness& ready);
  // Finishes the step: reduces the buckets not yet complete, waits for every reduction started
  // since the last wait(), and writes the batched results back. If any failed, throws the first
  // failure once all have finished.
  void wait();
  // wait(), but device tensors' reductions are ordered before work later given to `cuda_stream`
  // (a cudaStream_t) instead of waited for: the host blocks only until each is launched, as
  // Handle::synchronize_stream does. Host tensors are waited for as wait() does. A device
  // reduction that fails after its launch is reported by the next wait() or synchronize_stream().
  void synchronize_stream(void* cuda_stream);

  size_t size() const;
  // Tensors started since the last wait().
  size_t in_flight() const;
  // Buckets the batched tensors fall into.
  size_t bucket_count() const;
  // Steps whose last bucket the calling thread reduced itself.
  uint64_t caller_reductions() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Completes once every rank (of the process set) has entered the barrier.
Handle barrier(const std::string& name = "");
Handle barrier(const std::string& name, const ProcessSet& process_set);

}  // namespace gradsync
