// The public C++ API's lifecycle and topology: init(), shutdown(), the timeline switches, the
// one runtime they create and destroy, and what this build offers for devices.
#include <climits>
#include <memory>
#include <mutex>
#include <string>

#include "bindings/runtime.h"
#include "ops/device/device_plane_factory.h"
#include "runtime/logging.h"
#include "runtime/thread_role.h"

namespace gradsync {

namespace {

// Set by init(), cleared by shutdown(); neither may race with enqueues (see the header).
std::mutex g_lifecycle_mu;
std::unique_ptr<Runtime> g_runtime;
std::atomic<Runtime*> g_active{nullptr};
std::atomic<bool> g_was_shut_down{false};

}  // namespace

[[noreturn]] void Throw(Status status) { throw Error(std::move(status)); }

void RequireCallerThread(const char* call) {
  if (!OnBackgroundThread()) return;
  Throw(Status::InvalidArgument(
      std::string(call) +
      "() was called from a completion callback or an output allocator, which run on gradsync's "
      "background thread: that thread completes every handle, so blocking there would deadlock "
      "the process. Call it from your own thread; inside a callback, use the Status it is given, "
      "or poll() and status()"));
}

Runtime& ActiveRuntime(const char* call) {
  Runtime* rt = g_active.load(std::memory_order_acquire);
  if (rt == nullptr) {
    Throw(Status::NotInitialized(
        std::string(call) + (g_was_shut_down ? ": gradsync was shut down; call gradsync::init() "
                                               "to start it again"
                                             : ": gradsync is not initialized; call "
                                               "gradsync::init() first")));
  }
  return *rt;
}

void NoteCallerWait(const OpState& state) {
  Runtime* rt = g_active.load(std::memory_order_acquire);
  if (rt == nullptr) return;
  rt->caller_waits.fetch_add(1, std::memory_order_relaxed);
  if (!state.done()) rt->queue.EndPause();
}

namespace {

// Ranks whose settings differ would run different collectives (other buckets, a calibration or a
// tuning window only some take part in) and hang or mix data: every rank fails init alike.
Status CheckSharedSettings(const Config& config, MPI_Comm comm) {
  const std::vector<std::pair<const char*, int64_t>> settings = config.SharedSettings();
  std::vector<int64_t> lowest, highest;
  for (const auto& setting : settings) lowest.push_back(setting.second);
  highest = lowest;
  const int count = static_cast<int>(settings.size());
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, lowest.data(), count, MPI_INT64_T, MPI_MIN, comm));
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, highest.data(), count, MPI_INT64_T, MPI_MAX, comm));
  for (size_t i = 0; i < settings.size(); ++i) {
    if (lowest[i] == highest[i]) continue;
    return Status::InvalidArgument(
        std::string(settings[i].first) +
        " differs between ranks (set on some and not others, or to other values): every rank "
        "must have the same, or none (mpirun -x " +
        settings[i].first + " passes this shell's to every rank)");
  }
  return Status::OK();
}

// A setting that does not parse on some ranks only (a wrapper that sets it per rank, a launcher
// that did not pass the environment alike) would fail init there alone while the others waited
// for those ranks in init's next collective: every rank fails, with the lowest such rank's error.
Status AgreeOnParsedSettings(const Status& parsed, MPI_Comm comm) {
  int rank = 0;
  GRADSYNC_MPI_CALL(MPI_Comm_rank(comm, &rank));
  int first_failing = parsed.ok() ? INT_MAX : rank;
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, &first_failing, 1, MPI_INT, MPI_MIN, comm));
  if (first_failing == INT_MAX) return Status::OK();
  std::string message = rank == first_failing ? parsed.message() : std::string();
  int length = static_cast<int>(message.size());
  GRADSYNC_MPI_CALL(MPI_Bcast(&length, 1, MPI_INT, first_failing, comm));
  message.resize(static_cast<size_t>(length));
  GRADSYNC_MPI_CALL(MPI_Bcast(message.data(), length, MPI_CHAR, first_failing, comm));
  return Status::InvalidArgument(message + " (on rank " + std::to_string(first_failing) + ")");
}

}  // namespace

void init(MPI_Comm comm) {
  InitOptions options;
  options.comm = comm;
  init(options);
}

void init(const InitOptions& options) {
  RequireCallerThread("init");
  std::lock_guard<std::mutex> lock(g_lifecycle_mu);
  if (g_runtime) return;
  auto rt = std::make_unique<Runtime>();
  // A failed parse leaves the defaults, enough to make the communicators and agree on it.
  const Status parsed = Config::FromEnvironment(&rt->config);
  Status status = MpiContext::Create(options.comm, &rt->mpi);
  if (!status.ok()) Throw(parsed.ok() ? status : parsed);
  status = AgreeOnParsedSettings(parsed, rt->mpi->control_comm());
  if (!status.ok()) Throw(status);
  InitLogging(rt->mpi->rank(), rt->config.log_level);
  status = CheckSharedSettings(rt->config, rt->mpi->control_comm());
  if (!status.ok()) Throw(status);
  // A caller lane's reduction runs on the caller's thread beside the loop's MPI calls.
  if (!rt->mpi->calls_mpi_concurrently()) rt->config.caller_reduce = false;
  Log().debug("gradsync starting on {} ranks: {}", rt->mpi->size(), rt->config.ToString());
  status = SetUpLaunch(rt->config, *rt->mpi, options.comm, &rt->launch);
  if (!status.ok()) Throw(status);
  rt->config.cache_bytes = rt->launch.cache_bytes;
  // The GPU chosen for this rank, which a joined rank's stand-ins go to before it has a plane.
  if (rt->launch.gpu >= 0) rt->config.gpu_device = rt->launch.gpu;
  if (!rt->config.timeline_path.empty() && rt->mpi->rank() == 0) {
    // Not fatal: the other ranks cannot learn of it without another collective, and training
    // without a trace beats a job that stops over one.
    const Status started = rt->timeline.Start(rt->config.timeline_path);
    if (!started.ok()) Log().error("GRADSYNC_TIMELINE: {}; no timeline", started.message());
  }
  rt->loop = std::make_unique<BackgroundLoop>(rt->config, *rt->mpi, &rt->queue, &rt->timeline,
                                              &rt->registry, rt->lanes.get());
  status = AddDeclaredProcessSets(*rt, options.process_sets);
  if (!status.ok()) Throw(status);
  rt->loop->Start([launch = rt->launch] { launch.BindBackgroundThread(); });
  g_active.store(rt.get(), std::memory_order_release);
  g_runtime = std::move(rt);
}

void shutdown() {
  RequireCallerThread("shutdown");
  std::lock_guard<std::mutex> lock(g_lifecycle_mu);
  if (!g_runtime) return;
  g_active.store(nullptr, std::memory_order_release);
  g_runtime->loop->Shutdown();
  g_runtime->loop.reset();
  g_runtime->lanes->Close();
  const Status stopped = g_runtime->timeline.Stop();
  if (!stopped.ok()) Log().error("timeline: {}", stopped.message());
  g_runtime.reset();  // frees the communicators, finalizes MPI if init() started it
  g_was_shut_down = true;
}

void start_timeline(const std::string& path) {
  Runtime& rt = ActiveRuntime("start_timeline");
  if (rt.mpi->rank() != 0) return;
  const Status started = rt.timeline.Start(path);
  if (!started.ok()) Throw(started);
}

void stop_timeline() {
  Runtime& rt = ActiveRuntime("stop_timeline");
  const Status stopped = rt.timeline.Stop();
  if (!stopped.ok()) Throw(stopped);
}

bool is_initialized() { return g_active.load(std::memory_order_acquire) != nullptr; }

int rank() { return ActiveRuntime("rank").mpi->rank(); }
int size() { return ActiveRuntime("size").mpi->size(); }
int local_rank() { return ActiveRuntime("local_rank").mpi->local_rank(); }
int local_size() { return ActiveRuntime("local_size").mpi->local_size(); }
int cross_rank() { return ActiveRuntime("cross_rank").mpi->cross_rank(); }
int cross_size() { return ActiveRuntime("cross_size").mpi->cross_size(); }
int gpu_device() { return ActiveRuntime("gpu_device").launch.gpu; }

bool cuda_built() { return BuiltWithCuda(); }

int nccl_version() { return NcclVersion(); }

void* allocate_device_memory(int device, size_t bytes) {
  void* data = nullptr;
  const Status allocated = AllocateDeviceMemory(device, bytes, &data);
  if (!allocated.ok()) Throw(allocated);
  return data;
}

void free_device_memory(int device, void* data) {
  const Status freed = FreeDeviceMemory(device, data);
  if (!freed.ok()) Throw(freed);
}

}  // namespace gradsync
