#include "runtime/mpi_context.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#ifdef __linux__
#include <sched.h>
#endif

#include "runtime/logging.h"

namespace gradsync {

bool MpiUsable() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

namespace {

std::mutex& AbandonedMutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<MPI_Comm>& Abandoned() {
  static auto* comms = new std::vector<MPI_Comm>();  // never destroyed: read at exit
  return *comms;
}

}  // namespace

void AbandonCommunicator(MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(AbandonedMutex());
  Abandoned().push_back(comm);
}

void FreeCommunicator(MPI_Comm* comm) {
  if (*comm == MPI_COMM_NULL) return;
  {
    std::lock_guard<std::mutex> lock(AbandonedMutex());
    const std::vector<MPI_Comm>& abandoned = Abandoned();
    if (std::find(abandoned.begin(), abandoned.end(), *comm) != abandoned.end()) {
      *comm = MPI_COMM_NULL;
      return;
    }
  }
  MPI_Comm_free(comm);
}

namespace {

// The CPUs this process may run on (all of the node's where that cannot be asked).
int AllowedCpus(int node_cpus) {
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  return node_cpus;
}

std::string WorldRankString() {
  int rank = -1;
  if (!MpiUsable() || MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) return "?";
  return std::to_string(rank);
}

// Open MPI aborts the process when MPI_Error_string is called after MPI_Finalize.
std::string MpiErrorString(int rc) {
  if (!MpiUsable()) return "MPI error code " + std::to_string(rc);
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(rc);
  }
  return std::string(text, length);
}

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// `agreed` is the lowest level of any rank, which decides what gradsync does on every rank.
void WarnIfNotMultiple(int provided, int agreed) {
  if (agreed >= MPI_THREAD_MULTIPLE) return;
  Log().warn(
      "MPI provides {} on this rank ({} on the lowest) rather than MPI_THREAD_MULTIPLE: gradsync "
      "makes its MPI calls from one thread at a time (the background loop's, or a caller's "
      "holding it), with no caller-thread reductions, and refuses the MPI backend for device "
      "tensors, whose stream thread calls MPI beside the loop (below MPI_THREAD_SERIALIZED even "
      "that is outside what MPI promises). Avoid MPI calls from the application while gradsync "
      "is running, or initialize MPI with MPI_THREAD_MULTIPLE.",
      ThreadLevelName(provided), ThreadLevelName(agreed));
}

// A handle that is no communicator (a freed one's, a stale Fortran handle) raises MPI_ERR_COMM on
// MPI_COMM_WORLD (MPI_COMM_SELF in MPI 4), whose default handler ends the job: asked with both
// returning errors, then their handlers put back.
Status CheckCommunicator(MPI_Comm base) {
  const std::string invalid =
      "init(): the communicator given is not a valid one (freed, or a stale handle)";
  if (base == MPI_Comm{}) return Status::InvalidArgument(invalid);
  MPI_Errhandler world = MPI_ERRHANDLER_NULL, self = MPI_ERRHANDLER_NULL;
  GRADSYNC_MPI_CALL(MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world));
  GRADSYNC_MPI_CALL(MPI_Comm_get_errhandler(MPI_COMM_SELF, &self));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  int size = 0;
  const int rc = MPI_Comm_size(base, &size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, world);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, self);
  MPI_Errhandler_free(&world);
  MPI_Errhandler_free(&self);
  if (rc != MPI_SUCCESS) return Status::InvalidArgument(invalid + ": " + MpiErrorString(rc));
  return Status::OK();
}

// Frees a temporary communicator on every path out of the topology query.
class ScopedComm {
 public:
  ScopedComm() = default;
  ~ScopedComm() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  ScopedComm(const ScopedComm&) = delete;
  ScopedComm& operator=(const ScopedComm&) = delete;
  MPI_Comm* out() { return &comm_; }
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  int node_leader = 0;
};

// Local: the ranks that share this node's memory. Cross: the ranks with the same local rank on
// every node, ordered by global rank, as hierarchical collectives need.
Status QueryTopology(MPI_Comm base, Topology* t) {
  GRADSYNC_MPI_CALL(MPI_Comm_rank(base, &t->rank));
  GRADSYNC_MPI_CALL(MPI_Comm_size(base, &t->size));
  ScopedComm local;
  GRADSYNC_MPI_CALL(
      MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, t->rank, MPI_INFO_NULL, local.out()));
  GRADSYNC_MPI_CALL(MPI_Comm_rank(local.get(), &t->local_rank));
  GRADSYNC_MPI_CALL(MPI_Comm_size(local.get(), &t->local_size));
  GRADSYNC_MPI_CALL(MPI_Allreduce(&t->rank, &t->node_leader, 1, MPI_INT, MPI_MIN, local.get()));
  ScopedComm cross;
  GRADSYNC_MPI_CALL(MPI_Comm_split(base, t->local_rank, t->rank, cross.out()));
  GRADSYNC_MPI_CALL(MPI_Comm_rank(cross.get(), &t->cross_rank));
  GRADSYNC_MPI_CALL(MPI_Comm_size(cross.get(), &t->cross_size));
  return Status::OK();
}

// Sets *owns only when this call initialized MPI: an application that initialized MPI itself also
// finalizes it, and gradsync must leave it usable after shutdown().
Status EnsureMpiInitialized(bool* owns, int* provided_level) {
  int finalized = 0;
  GRADSYNC_MPI_CALL(MPI_Finalized(&finalized));
  if (finalized) {
    return Status::NotInitialized(
        "MPI has already been finalized in this process and cannot be initialized again; to call "
        "init() after shutdown(), initialize MPI in the application before the first init()");
  }
  int initialized = 0;
  int provided = MPI_THREAD_SINGLE;
  GRADSYNC_MPI_CALL(MPI_Initialized(&initialized));
  if (initialized) {
    GRADSYNC_MPI_CALL(MPI_Query_thread(&provided));
  } else {
    GRADSYNC_MPI_CALL(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    *owns = true;
  }
  *provided_level = provided;
  return Status::OK();
}

}  // namespace

int CoresPerRank(int allowed_cpus, int node_cpus, int local_size) {
  const int even_share = std::max(1, node_cpus) / std::max(1, local_size);
  return std::max(1, std::min(std::max(1, allowed_cpus), even_share));
}

Status MpiResult(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return Status::OK();
  return Status::MpiError(std::string(call) + " failed on rank " + WorldRankString() + ": " +
                          MpiErrorString(rc));
}

Status DupWithReturnedErrors(MPI_Comm base, MPI_Comm* out) {
  MPI_Comm dup = MPI_COMM_NULL;
  GRADSYNC_MPI_CALL(MPI_Comm_dup(base, &dup));
  const Status handler =
      MpiResult(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  if (!handler.ok()) {
    MPI_Comm_free(&dup);
    return handler;
  }
  *out = dup;
  return Status::OK();
}

Status MpiContext::Create(MPI_Comm base, std::unique_ptr<MpiContext>* out) {
  if (base == MPI_COMM_NULL)
    return Status::InvalidArgument("MpiContext: base communicator is null");
  // Owned through the unique_ptr from here on, so every error path below frees what was created
  // (and finalizes MPI if this call initialized it).
  std::unique_ptr<MpiContext> context(new MpiContext());
  int provided = MPI_THREAD_SINGLE;
  GRADSYNC_RETURN_IF_ERROR(EnsureMpiInitialized(&context->owns_mpi_, &provided));
  GRADSYNC_RETURN_IF_ERROR(CheckCommunicator(base));
  GRADSYNC_RETURN_IF_ERROR(DupWithReturnedErrors(base, &context->control_comm_));
  // Agreed, so that every rank confines its MPI calls alike (a caller lane on some ranks only
  // would leave the others' reductions unmatched).
  GRADSYNC_MPI_CALL(MPI_Allreduce(&provided, &context->thread_level_, 1, MPI_INT, MPI_MIN,
                                  context->control_comm_));
  WarnIfNotMultiple(provided, context->thread_level_);
  GRADSYNC_RETURN_IF_ERROR(DupWithReturnedErrors(base, &context->data_comm_));
  Topology t;
  GRADSYNC_RETURN_IF_ERROR(QueryTopology(base, &t));
  context->rank_ = t.rank;
  context->size_ = t.size;
  context->local_rank_ = t.local_rank;
  context->local_size_ = t.local_size;
  context->cross_rank_ = t.cross_rank;
  context->cross_size_ = t.cross_size;
  context->node_leader_ = t.node_leader;
  const int node_cpus = static_cast<int>(std::thread::hardware_concurrency());
  context->cores_per_rank_ = CoresPerRank(AllowedCpus(node_cpus), node_cpus, t.local_size);
  *out = std::move(context);
  return Status::OK();
}

// If the application finalized MPI first, the communicators are already gone and freeing them
// would be an error; there is nothing left to release.
MpiContext::~MpiContext() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  FreeCommunicator(&control_comm_);
  FreeCommunicator(&data_comm_);
  if (owns_mpi_) FinalizeMpi();
}

// Open MPI's MPI_Finalize begins with a barrier over every process of the job, so a rank that
// shuts down early waits here for the slowest one; said once, so the time is not blamed on
// gradsync.
void MpiContext::FinalizeMpi() {
  const auto start = std::chrono::steady_clock::now();
  const int rc = MPI_Finalize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rc != MPI_SUCCESS) {
    Log().error("MPI_Finalize failed with MPI error code {}", rc);
  } else if (seconds > 1.0) {
    Log().info(
        "MPI_Finalize took {:.1f} s: the MPI library waits there until every rank has called it",
        seconds);
  }
}

Status SubsetCommunicators::Split(const MpiContext& mpi, const std::vector<int>& ranks,
                                  std::unique_ptr<SubsetCommunicators>* out) {
  std::unique_ptr<SubsetCommunicators> comms(new SubsetCommunicators());
  const bool member = std::binary_search(ranks.begin(), ranks.end(), mpi.rank());
  const int color = member ? 0 : MPI_UNDEFINED;
  GRADSYNC_MPI_CALL(MPI_Comm_split(mpi.control_comm(), color, mpi.rank(), &comms->control_));
  GRADSYNC_MPI_CALL(MPI_Comm_split(mpi.data_comm(), color, mpi.rank(), &comms->data_));
  *out = std::move(comms);
  return Status::OK();
}

SubsetCommunicators::~SubsetCommunicators() {
  if (!MpiUsable()) return;
  FreeCommunicator(&control_);
  FreeCommunicator(&data_);
}

}  // namespace gradsync
