#include "bindings/launch_setup.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "ops/device/gpu_inventory.h"
#include "runtime/launch_check.h"
#include "runtime/logging.h"

namespace gradsync {
namespace {

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

bool SpansWorld(MPI_Comm base) {
  int result = MPI_UNEQUAL;
  return MPI_Comm_compare(base, MPI_COMM_WORLD, &result) == MPI_SUCCESS &&
         (result == MPI_IDENT || result == MPI_CONGRUENT);
}

Status ChooseGpu(const Config& config, const MpiContext& mpi, const std::vector<std::string>& gpus,
                 int* gpu) {
  *gpu = -1;
  if (gpus.empty()) return Status::OK();
  const int count = static_cast<int>(gpus.size());
  if (config.gpu_device >= count) {
    return Status::InvalidArgument("GRADSYNC_GPU_DEVICE=" + std::to_string(config.gpu_device) +
                                   ", but rank " + std::to_string(mpi.rank()) + " sees only " +
                                   std::to_string(count) + " GPU(s) (0 to " +
                                   std::to_string(count - 1) + ")");
  }
  *gpu = config.gpu_device >= 0 ? config.gpu_device : mpi.local_rank() % count;
  return Status::OK();
}

// This rank as the launcher left it.
RankRecord DescribeSelf(const MpiContext& mpi, const HwlocNode* node, const NodeLayout& layout,
                        const LauncherView& launcher, int gpu,
                        const std::vector<std::string>& gpus) {
  RankRecord self;
  self.rank = mpi.rank();
  self.node_leader = mpi.node_leader();
  self.local_rank = mpi.local_rank();
  self.local_size = mpi.local_size();
  self.launcher_local_size = launcher.local_size;
  self.host = HostName();
  LocalRank& place = self.placement;
  if (node != nullptr) {
    self.cache_bytes = node->LastLevelCacheBytes();
    const Status read = node->ThreadBinding(&place.bound_to);
    if (!read.ok()) Log().warn("placement: {}", read.message());
    place.bound_by_launcher = !place.bound_to.empty() && place.bound_to != layout.allowed &&
                              place.bound_to.IsSubsetOf(layout.allowed);
  }
  if (gpu >= 0) {
    place.gpu = gpu;
    place.gpu_bus_id = gpus[gpu];
    if (node != nullptr) place.gpu_cpus = node->CpusNearPciDevice(place.gpu_bus_id);
  }
  return self;
}

std::vector<LocalRank> RanksOfNode(const std::vector<RankRecord>& records, int node_leader) {
  std::vector<LocalRank> ranks;
  for (const RankRecord& r : records) {
    if (r.node_leader != node_leader) continue;
    if (static_cast<int>(ranks.size()) <= r.local_rank) ranks.resize(r.local_rank + 1);
    ranks[r.local_rank] = r.placement;
  }
  return ranks;
}

// Every rank returns the lowest failing rank's error, so that init() fails everywhere alike
// instead of leaving the other ranks waiting in their next collective.
Status ShareFirstFailure(MPI_Comm comm, const Status& mine) {
  int rank = 0;
  GRADSYNC_MPI_CALL(MPI_Comm_rank(comm, &rank));
  const int candidate = mine.ok() ? INT_MAX : rank;
  int first = INT_MAX;
  GRADSYNC_MPI_CALL(MPI_Allreduce(&candidate, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return Status::OK();
  std::string message = mine.message();
  int length = static_cast<int>(message.size());
  GRADSYNC_MPI_CALL(MPI_Bcast(&length, 1, MPI_INT, first, comm));
  message.resize(length);
  GRADSYNC_MPI_CALL(MPI_Bcast(message.data(), length, MPI_CHAR, first, comm));
  if (rank == first) return mine;
  return Status::InvalidArgument("rank " + std::to_string(first) + ": " + message);
}

}  // namespace

void LaunchSetup::BindBackgroundThread() const {
  if (node == nullptr || placement.thread_cpus.empty()) return;
  const Status bound = node->BindCallingThread(placement.thread_cpus);
  if (!bound.ok())
    Log().warn("placement: {}; the background thread stays unbound", bound.message());
}

Status SetUpLaunch(const Config& config, const MpiContext& mpi, MPI_Comm base, LaunchSetup* out) {
  const LauncherView launcher = ReadLauncherView(nullptr);
  int world_size = 1;
  GRADSYNC_MPI_CALL(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  GRADSYNC_RETURN_IF_ERROR(CheckNotAlone(world_size, launcher));

  const std::vector<std::string> gpus = VisibleGpuBusIds();
  Status mine = ChooseGpu(config, mpi, gpus, &out->gpu);
  std::unique_ptr<HwlocNode> node;
  const Status loaded = HwlocNode::Load(!gpus.empty(), &node);
  if (!loaded.ok()) {
    Log().warn("placement: hwloc cannot read this node ({}); not binding", loaded.message());
  }
  const NodeLayout layout = node ? node->Layout() : NodeLayout();
  const RankRecord self = DescribeSelf(mpi, node.get(), layout, launcher, out->gpu, gpus);
  std::vector<RankRecord> records;
  GRADSYNC_RETURN_IF_ERROR(GatherRankRecords(mpi.control_comm(), self, &records));
  GRADSYNC_RETURN_IF_ERROR(CheckRankRecords(records, config.gpu_backend, SpansWorld(base)));

  PlacementRequest request;
  request.bind_process = config.bind_process;
  if (mine.ok()) {
    mine = ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", config.thread_affinity, &request);
  }
  if (mine.ok() && node) {
    mine = PlanPlacement(layout, RanksOfNode(records, mpi.node_leader()), mpi.local_rank(), request,
                         &out->placement);
  }
  GRADSYNC_RETURN_IF_ERROR(ShareFirstFailure(mpi.control_comm(), mine));
  // The smallest over every rank (0 where one is unknown), so that every rank plans alike.
  out->cache_bytes = self.cache_bytes;
  for (const RankRecord& r : records) out->cache_bytes = std::min(out->cache_bytes, r.cache_bytes);
  if (!node) return Status::OK();
  if (!out->placement.process_cpus.empty()) {
    const Status bound = node->BindProcess(out->placement.process_cpus);
    if (!bound.ok()) Log().warn("placement: {}; the process stays as it was", bound.message());
  }
  Log().info("placement: rank {} (local {} of {}) on {}: {}{}", mpi.rank(), mpi.local_rank(),
             mpi.local_size(), self.host, out->gpu < 0 ? "no GPU; " : "",
             DescribePlacement(self.placement, out->placement));
  out->node = std::move(node);
  return Status::OK();
}

}  // namespace gradsync
