// A small trainer that one rank (the victim) kills with SIGKILL at a chosen point, so the fault
// driver (run_fault.sh) can check how the job ends on the other ranks: how fast, and with what
// message. It uses only the public API, as an application would.
//
//   fault_program <scenario> <victim rank> <on error: shutdown | abort>
//
// Scenarios, by the phase the victim dies in:
//   negotiate-before  the victim dies without enqueueing the step's tensors; the others have
//                     enqueued theirs and sit in control rounds that it never joins
//   negotiate-after   the victim enqueues the step's tensors, then dies at once, while its own
//                     background thread is picking them up or negotiating them
//   allocator         the victim dies inside its reducescatter output allocator, which runs on
//                     the background thread just before the data-plane collective
//   callback          the victim dies in the completion callback of the first bucket of a step
//                     fused into several buckets; the others are in the next bucket's collective
//   shutdown-callback the victim calls shutdown() with an operation no other rank submitted; the
//                     operation's callback, run as shutdown fails it, kills the victim while the
//                     others are in their own shutdown()
//   shutdown-thread   a thread of the victim's kills it just after it called shutdown()
//   stall             the victim stays alive but stops submitting for a while: every pending
//                     handle of the others fails with the stall inspector's message, which names
//                     the victim, and the victim's next enqueue throws it
//   hang              as stall, but the victim never comes back
//   callback-stuck    the victim's completion callback for the last bucket of a step never
//                     returns, so its background thread stops taking part: the others' next
//                     control round (or locked bucket's exchange) gives up after the stall
//                     shutdown time, failing every pending handle with a message that says a
//                     background thread is stuck
//
// The victim writes "fault: rank R dies <where> at T" (T: CLOCK_REALTIME seconds) to stderr just
// before dying, so the driver can measure from the death to the end of the job. A rank whose
// operation fails writes "fault: rank R: <error>" and ends, as a trainer whose exception escapes
// would: "shutdown" calls gradsync::shutdown() and exits with status 3; "abort" calls
// MPI_Abort(MPI_COMM_WORLD, 3), which ends the job without waiting for ranks that will never
// finalize.
#include <gradsync/gradsync.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

// Long enough for the launcher to act on a death; a survivor still waiting after it reports so.
constexpr auto kWaitLimit = std::chrono::seconds(100);
constexpr int kSteps = 1000000;  // the survivors' loop ends through the fault, not through this
constexpr int kDeathStep = 3;    // a few steps first, so the response cache is warm
// Past the step the schedule locks at (GRADSYNC_LOCK_AFTER_STEPS, 3 by default).
constexpr int kStuckStep = 8;
constexpr int kTensors = 8;
constexpr int64_t kElements = 1024;  // 4 KiB per tensor; the tests set an 8 KiB fusion buffer
// The driver's GRADSYNC_STALL_SHUTDOWN_SECONDS is well below this.
constexpr auto kStallPause = std::chrono::seconds(3);

bool g_abort_on_error = false;

double Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

[[noreturn]] void Die(int rank, const char* where) {
  std::fprintf(stderr, "fault: rank %d dies %s at %.6f\n", rank, where, Now());
  std::fflush(stderr);
  std::raise(SIGKILL);
  std::abort();  // not reached
}

[[noreturn]] void Fail(int rank, const gradsync::Error& e) {
  std::fprintf(stderr, "fault: rank %d: %s\n", rank, e.what());
  std::fflush(stderr);
  if (g_abort_on_error) MPI_Abort(MPI_COMM_WORLD, 3);
  gradsync::shutdown();  // as a trainer's cleanup would
  std::exit(3);
}

// Waits for every handle; a failure or a wait past kWaitLimit ends this survivor. On a failure,
// every handle of the step must have failed the same way: one line says whether they did.
void WaitAll(const std::vector<gradsync::Handle>& handles, int rank) {
  for (const gradsync::Handle& h : handles) {
    try {
      if (!h.wait_for(kWaitLimit)) {
        std::fprintf(stderr, "fault: rank %d: still waiting after %lld s\n", rank,
                     static_cast<long long>(kWaitLimit.count()));
        std::exit(4);
      }
    } catch (const gradsync::Error& e) {
      size_t same = 0;
      for (const gradsync::Handle& other : handles) {
        try {
          other.wait_for(kWaitLimit);
        } catch (const gradsync::Error&) {
        }
        const gradsync::Status status = other.status();
        same += status.code() == e.code() && status.message() == e.status().message() ? 1 : 0;
      }
      std::fprintf(stderr, "fault: rank %d: %zu of %zu handles failed with this error\n", rank,
                   same, handles.size());
      Fail(rank, e);
    }
  }
}

struct Step {
  std::vector<std::vector<float>> inputs;
  std::vector<std::vector<float>> outputs;
  std::vector<gradsync::Handle> handles;
};

// One step's allreduces, fused by the driver's settings into buckets of two tensors; the first
// and the last tensor's completion run the callbacks given, if any.
void EnqueueAllreduces(Step* step, const gradsync::CompletionCallback& on_first,
                       const gradsync::CompletionCallback& on_last = nullptr) {
  step->inputs.assign(kTensors, std::vector<float>(kElements, 1.0f));
  for (int t = 0; t < kTensors; ++t) {
    gradsync::AllreduceOptions options;
    options.name = "grad." + std::to_string(t);
    if (t == 0 && on_first) options.on_complete = on_first;
    if (t == kTensors - 1 && on_last) options.on_complete = on_last;
    step->handles.push_back(gradsync::allreduce(
        gradsync::TensorView(step->inputs[t].data(), gradsync::DataType::kFloat32, {kElements}),
        options));
  }
}

// One step's reducescatters; the victim's allocator kills it at the death step.
void EnqueueReducescatters(Step* step, int number, int rank, int victim) {
  step->inputs.assign(kTensors, std::vector<float>(kElements, 1.0f));
  step->outputs.assign(kTensors, std::vector<float>());
  for (int t = 0; t < kTensors; ++t) {
    std::vector<float>* out = &step->outputs[t];
    const bool dies = rank == victim && number == kDeathStep && t == 0;
    gradsync::Allocator allocate = [out, dies, rank](const std::vector<int64_t>& shape,
                                                     gradsync::DataType) -> void* {
      if (dies) Die(rank, "in a reducescatter output allocator");
      out->resize(static_cast<size_t>(shape[0]));
      return out->data();
    };
    gradsync::ReducescatterOptions options;
    options.name = "shard." + std::to_string(t);
    step->handles.push_back(gradsync::reducescatter(
        gradsync::TensorView(step->inputs[t].data(), gradsync::DataType::kFloat32, {kElements}),
        allocate, options));
  }
}

void Train(const std::string& scenario, int rank, int victim) {
  for (int number = 0; number < kSteps; ++number) {
    const bool death_step = rank == victim && number == kDeathStep;
    if (death_step && scenario == "negotiate-before") Die(rank, "before enqueueing a step");
    if (death_step && scenario == "stall") {
      std::fprintf(stderr, "fault: rank %d stops submitting at %.6f\n", rank, Now());
      std::fflush(stderr);
      // Alive, its background thread running, but busy elsewhere (I/O, a diverging branch) for
      // longer than the stall shutdown time; its next enqueue then gets the stall error.
      std::this_thread::sleep_for(kStallPause);
    }
    if (death_step && scenario == "hang") {
      std::fprintf(stderr, "fault: rank %d stops submitting for good at %.6f\n", rank, Now());
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    Step step;
    try {
      if (scenario == "allocator") {
        EnqueueReducescatters(&step, number, rank, victim);
      } else {
        gradsync::CompletionCallback on_first;
        if (death_step && scenario == "callback") {
          on_first = [rank](const gradsync::Status&) {
            Die(rank, "in the completion callback of a step's first bucket");
          };
        }
        gradsync::CompletionCallback on_last;
        if (rank == victim && number == kStuckStep && scenario == "callback-stuck") {
          on_last = [rank](const gradsync::Status&) {
            std::fprintf(stderr, "fault: rank %d stops submitting: its callback blocks at %.6f\n",
                         rank, Now());
            std::fflush(stderr);
            std::this_thread::sleep_for(std::chrono::hours(1));
          };
        }
        EnqueueAllreduces(&step, on_first, on_last);
      }
    } catch (const gradsync::Error& e) {
      Fail(rank, e);
    }
    if (death_step && scenario == "negotiate-after") Die(rank, "just after enqueueing a step");
    WaitAll(step.handles, rank);
  }
}

// Both ranks of every kind finish a step, then all shut down; the victim dies during its shutdown.
void ShutDown(const std::string& scenario, int rank, int victim) {
  Step step;
  EnqueueAllreduces(&step, nullptr);
  WaitAll(step.handles, rank);
  std::thread killer;
  float only_here[4] = {};
  gradsync::Handle pending;
  if (rank == victim && scenario == "shutdown-callback") {
    gradsync::AllreduceOptions options;
    options.name = "only.on.victim";
    options.on_complete = [rank](const gradsync::Status&) {
      Die(rank, "in a completion callback run by shutdown()");
    };
    pending = gradsync::allreduce(
        gradsync::TensorView(only_here, gradsync::DataType::kFloat32, {4}), options);
  }
  if (rank == victim && scenario == "shutdown-thread") {
    killer = std::thread([rank] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      Die(rank, "from another thread while in shutdown()");
    });
  }
  gradsync::shutdown();
  if (killer.joinable()) killer.join();  // the victim never gets past this
  std::fprintf(stderr, "fault: rank %d finished shutdown() at %.6f\n", rank, Now());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <scenario> <victim rank> <shutdown|abort>\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  const int victim = std::atoi(argv[2]);
  g_abort_on_error = std::string(argv[3]) == "abort";
  try {
    gradsync::init();
  } catch (const gradsync::Error& e) {
    std::fprintf(stderr, "fault: init failed: %s\n", e.what());
    return 2;
  }
  const int rank = gradsync::rank();
  if (scenario.rfind("shutdown-", 0) == 0) {
    ShutDown(scenario, rank, victim);
    return 0;
  }
  Train(scenario, rank, victim);
  gradsync::shutdown();
  return 0;
}
