// Internals shared by the files of the C++ API: the runtime that init() creates, and the enqueue
// path every operation takes.
//
// Thread safety: as the public header says. ActiveRuntime, NewEntry and Submit may be called from
// any thread while gradsync runs; the runtime's members document their own rules.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings/launch_setup.h"
#include "coordinator/background_loop.h"
#include "gradsync/gradsync.h"
#include "runtime/caller_lanes.h"
#include "runtime/config.h"
#include "runtime/mpi_context.h"
#include "runtime/process_set_registry.h"
#include "runtime/tensor_queue.h"
#include "runtime/timeline.h"

namespace gradsync {

struct Runtime {
  Config config;
  std::unique_ptr<MpiContext> mpi;
  LaunchSetup launch;  // this rank's GPU and placement
  TensorQueue queue;
  Timeline timeline;  // written on rank 0 only; outlives the loop that records into it
  ProcessSetRegistry registry;
  // Shared with the batches that registered lanes, which may outlive the runtime.
  std::shared_ptr<CallerLaneTable> lanes = std::make_shared<CallerLaneTable>();
  std::unique_ptr<BackgroundLoop> loop;
  // Generated names: the global set's counters per op type, and the other sets' per op type and
  // set (their operations match only among the set's members, in the members' order).
  std::atomic<uint64_t> unnamed_counters[kNumOpTypes] = {};
  std::mutex unnamed_in_sets_mu;
  std::map<std::pair<int, int32_t>, uint64_t> unnamed_in_sets;
  // add_process_set and remove_process_set calls so far; collective, so the same on every rank.
  std::atomic<uint64_t> process_set_calls{0};
  // The caller's blocking waits on operations so far (wait(), wait_for(), synchronize_stream()),
  // which each enqueue notes in TensorEntry::waits_before. Counted whether or not the operation
  // was done, so that the count follows the program's order alone, as it does on every rank.
  std::atomic<uint64_t> caller_waits{0};
  // The CUDA device of this process's first device operation (-1: none yet). Every later one must
  // be on it: each rank has one device plane a kind, made collectively when first used, and the
  // ranks fuse device tensors by kind alone, so a second device would reach a plane (or a bucket)
  // the other ranks do not have.
  mutable std::atomic<int> cuda_device{-1};
};

[[noreturn]] void Throw(Status status);
// Throws InvalidArgument, naming `call`, when called on gradsync's background thread (from a
// completion callback or an output allocator), where a blocking call would deadlock the process.
void RequireCallerThread(const char* call);
// The running runtime; throws NotInitialized, naming `call`, when there is none.
Runtime& ActiveRuntime(const char* call);

// Called by a caller about to block on `state` (done or not). It counts the wait
// (Runtime::caller_waits) and, while the operation runs, ends the background thread's pause: the
// caller has no more tensors to stream for now (architecture.md, "Pacing a streaming caller").
// Does nothing when gradsync is not running.
void NoteCallerWait(const OpState& state);

Handle MakeHandle(std::shared_ptr<OpState> state);

// synchronize_stream()'s work: orders `cuda_stream` after each of `count` handles, once for each
// distinct completion (a fused bucket's members share one), and calls `failed` with the index and
// the error of each handle whose operation failed, those that share a failed completion included.
// `call` names the API call when refusing one from the background thread. `failed` may clear the
// handle it is told of: the handle is not read again.
void OrderStreamAfterHandles(const Handle* handles, size_t count, void* cuda_stream,
                             const char* call,
                             const std::function<void(size_t, const Error&)>& failed);
ProcessSet MakeProcessSet(int id);

// A cleared entry from the queue's pool, for `op` on `name` (empty: generated at submit).
std::unique_ptr<TensorEntry> NewEntry(Runtime& rt, OpType op, const std::string& name,
                                      CompletionCallback on_complete);
// Throws `validation` (with the operation, tensor and rank in front) unless it is OK; otherwise
// names the entry if needed, pushes it and returns its handle.
Handle Submit(Runtime& rt, std::unique_ptr<TensorEntry> entry, const Status& validation);

// Fills an allreduce entry from allreduce()'s arguments; not OK when they are refused (Submit
// then throws it).
Status FillAllreduce(const Runtime& rt, const TensorView& input, const TensorView& output,
                     const AllreduceOptions& options, TensorEntry* entry);

// Creates the process sets declared at init, after checking that every rank declared the same.
// Collective over every rank; fails identically everywhere.
Status AddDeclaredProcessSets(Runtime& rt, const std::vector<std::vector<int>>& declared);

}  // namespace gradsync
