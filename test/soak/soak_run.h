// Runs one soak step on this rank: fills the inputs, enqueues the step's operations in a
// rank-specific shuffled order (a late rank's last one after a pause), waits for every handle
// with one bounded deadline, and checks every result exactly. Join steps run their rounds and then
// join(); steps with an added process set add it first and remove it last.
//
// Anything wrong (an enqueue or wait that throws, a handle not done by the deadline, a wrong
// shape, split, element or callback count) is a failure: counted, and the first few printed with
// the step, collective, tensor name and process set. The runner keeps going; the caller decides
// when to stop.
//
// Thread safety: one thread (the program's main thread) drives a StepRunner. Completion callbacks
// and output allocators it registers run on gradsync's background thread and touch only the
// operation they belong to, until its handle completes.
#pragma once

#include <gradsync/gradsync.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/host_stream.h"
#include "test/soak/soak_plan.h"
#include "test/soak/soak_values.h"

namespace gradsync {
namespace soak {

struct Tally {
  int64_t steps = 0;
  int64_t ops = 0;    // handles that completed and checked out
  int64_t bytes = 0;  // input and output bytes of those operations on this rank
  int64_t joins = 0;  // join steps
  int64_t added_sets = 0;
  int64_t callbacks = 0;
  int64_t steady_steps = 0;              // the steady mode's steps of a stretch
  int64_t deviations[kDeviations] = {};  // its steps after one, by how they deviate
};

// Counts failures and prints the first `print_limit` of them to stderr, with the rank.
class Failures {
 public:
  Failures(int rank, int print_limit) : rank_(rank), print_limit_(print_limit) {}
  void Add(const std::string& what);
  int64_t count() const { return count_; }

 private:
  int rank_;
  int print_limit_;
  int64_t count_ = 0;
};

class StepRunner {
 public:
  // `sets[i]` is the ProcessSet of planner.sets()[i].
  // `device_tensors`: every tensor labelled cuda:0, for a device plane over the host backend;
  // half of the operations then name a producer stream (a HostStream standing in for a
  // cudaStream_t: give SetReadinessRecorderForTesting a recorder that records on it).
  StepRunner(const Planner& planner, std::vector<ProcessSet> sets, uint64_t seed,
             std::chrono::milliseconds wait_limit, bool device_tensors = false);
  ~StepRunner();
  // Runs `plan` on this rank. Returns what join() returned on a join step, -1 otherwise.
  int Run(const StepPlan& plan, Tally* tally, Failures* failures);

 private:
  struct Live;  // one enqueued operation, its buffers and handles
  // Enqueues and waits for `ops` (those this rank is a member of), then checks them against
  // reductions over `contributors` (null: the set's members) and an average's `divisor` (0: the
  // set's size). Returns false if some handle did not complete in time.
  bool RunOps(const StepPlan& plan, const std::vector<OpPlan>& ops, const ProcessSet* added,
              const std::vector<int>* contributors, int divisor, Tally* tally, Failures* failures);
  void Enqueue(Live* live, const ProcessSet& set, uint64_t local_choice);
  // Enqueues, catching what it throws into live->enqueue_error.
  void TryEnqueue(Live* live, const ProcessSet* added);
  // Waits for every handle of `live` until `deadline`, by wait_for or by polling; false on a hang.
  bool Wait(Live* live, std::chrono::steady_clock::time_point deadline, bool poll,
            Failures* failures);
  void Check(Live* live, const std::vector<int>& contributors, int divisor, Failures* failures);
  std::string Describe(const Live& live, size_t tensor) const;
  // The buffer as the operation is given it: on the host, or labelled cuda:0.
  TensorView View(Buffer* buffer) const;
  // Hands the writing of `input`'s values to the producer stream.
  void ProduceLater(Live* live, Buffer* input);

  const Planner& planner_;
  std::vector<ProcessSet> sets_;
  uint64_t seed_;
  std::chrono::milliseconds wait_limit_;
  bool device_tensors_;
  HostStream producer_;  // writes the inputs of operations given it as their producer
  int rank_;
  int size_;
  int64_t step_ = 0;
  // Operations that did not complete in time: gradsync may still write into their buffers, so
  // they are kept until shutdown() has failed them.
  std::vector<std::unique_ptr<Live>> abandoned_;
};

// Shared by soak_run.cc (enqueue, wait) and soak_check.cc (checks).
struct StepRunner::Live {
  const OpPlan* plan = nullptr;
  const std::vector<int>* members = nullptr;
  int me = -1;  // this rank within the set
  bool enqueued = false;
  bool out_of_place = false;
  bool callback = false;
  uint64_t choice = 0;        // this rank's local choices for the operation
  std::string enqueue_error;  // what the enqueue threw, if it did
  std::vector<std::unique_ptr<Buffer>> inputs;
  std::unique_ptr<Buffer> flat;  // the inputs' memory where they lie back to back in it
  std::vector<std::unique_ptr<Buffer>> outputs;   // out-of-place results and allocator memory
  std::vector<std::unique_ptr<Buffer>> produced;  // values the producer stream writes in
  std::vector<Handle> handles;
  std::atomic<int> callbacks{0};
  std::atomic<int> failed_callbacks{0};
};

// `rows` followed by `rest`.
std::vector<int64_t> WithRows(int64_t rows, const std::vector<int64_t>& rest);

}  // namespace soak
}  // namespace gradsync
