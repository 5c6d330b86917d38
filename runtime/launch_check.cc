#include "runtime/launch_check.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <map>

#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

bool ParsePositive(const char* text, int* out) {
  if (text == nullptr || *text == '\0') return false;
  const char* end = text + std::char_traits<char>::length(text);
  auto result = std::from_chars(text, end, *out);
  return result.ec == std::errc() && result.ptr == end && *out > 0;
}

// Slurm's "2(x3),1": tasks on each node of the step, in node order.
std::vector<int> ExpandTasksPerNode(const std::string& text) {
  std::vector<int> tasks;
  size_t start = 0;
  while (start < text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    int count = 0;
    int repeat = 1;
    const size_t paren = item.find("(x");
    if (!ParsePositive(item.substr(0, paren).c_str(), &count)) return {};
    if (paren != std::string::npos &&
        (item.back() != ')' ||
         !ParsePositive(item.substr(paren + 2, item.size() - paren - 3).c_str(), &repeat))) {
      return {};
    }
    tasks.insert(tasks.end(), repeat, count);
    start = comma + 1;
  }
  return tasks;
}

constexpr char kField = '\x1f';

std::string Encode(const RankRecord& r) {
  const LocalRank& p = r.placement;
  std::string text;
  for (const std::string& field :
       {std::to_string(r.rank), std::to_string(r.node_leader), std::to_string(r.local_rank),
        std::to_string(r.local_size), std::to_string(r.launcher_local_size), r.host,
        p.bound_to.ToString(), std::string(p.bound_by_launcher ? "1" : "0"), std::to_string(p.gpu),
        p.gpu_bus_id, p.gpu_cpus.ToString(), std::to_string(r.cache_bytes)}) {
    text += field;
    text += kField;
  }
  return text;
}

template <typename Int>
bool DecodeInt(const std::string& text, Int* out) {
  auto result = std::from_chars(text.data(), text.data() + text.size(), *out);
  return result.ec == std::errc() && result.ptr == text.data() + text.size();
}

bool DecodeCpus(const std::string& text, CpuList* out) {
  if (text.empty()) {
    *out = CpuList();
    return true;
  }
  return CpuList::Parse(text, out).ok();
}

bool Decode(const std::string& text, RankRecord* r) {
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t end; (end = text.find(kField, start)) != std::string::npos; start = end + 1) {
    f.push_back(text.substr(start, end - start));
  }
  if (f.size() != 12) return false;
  LocalRank& p = r->placement;
  r->host = f[5];
  p.bound_by_launcher = f[7] == "1";
  p.gpu_bus_id = f[9];
  return DecodeInt(f[0], &r->rank) && DecodeInt(f[1], &r->node_leader) &&
         DecodeInt(f[2], &r->local_rank) && DecodeInt(f[3], &r->local_size) &&
         DecodeInt(f[4], &r->launcher_local_size) && DecodeCpus(f[6], &p.bound_to) &&
         DecodeInt(f[8], &p.gpu) && DecodeCpus(f[10], &p.gpu_cpus) &&
         DecodeInt(f[11], &r->cache_bytes);
}

std::string RankNames(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return (ranks.size() == 1 ? "rank " : "ranks ") + text;
}

Status CheckHostsMatchNodes(const std::vector<RankRecord>& records) {
  std::map<std::string, std::map<int, std::vector<int>>> nodes_by_host;
  for (const RankRecord& r : records) nodes_by_host[r.host][r.node_leader].push_back(r.rank);
  for (const auto& [host, nodes] : nodes_by_host) {
    if (nodes.size() < 2) continue;
    std::string groups;
    for (const auto& [leader, ranks] : nodes) {
      groups += (groups.empty() ? "" : "; ") + RankNames(ranks) + " (local size " +
                std::to_string(ranks.size()) + ")";
    }
    return Status::InvalidArgument(
        "launch check: the ranks on host '" + host +
        "' disagree about their local size: MPI groups them by shared memory as " + groups +
        ". Processes with one host name that cannot share memory are usually in separate "
        "containers: give each container its own host name, or share the IPC namespace and "
        "/dev/shm between the ranks of one host (docker --ipc=host)");
  }
  return Status::OK();
}

Status CheckLauncherLocalSizes(const std::vector<RankRecord>& records) {
  for (const RankRecord& r : records) {
    if (r.launcher_local_size < 0 || r.launcher_local_size == r.local_size) continue;
    return Status::InvalidArgument(
        "launch check: on host '" + r.host + "' the launcher says rank " + std::to_string(r.rank) +
        " is one of " + std::to_string(r.launcher_local_size) +
        " ranks on its node, but MPI finds " + std::to_string(r.local_size) +
        " ranks sharing its memory, so local ranks (and the GPU each picks) would disagree. "
        "Launch every rank with the same launcher and MPI library the program is linked against, "
        "and do not set OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS or SLURM_STEP_TASKS_PER_NODE "
        "by hand");
  }
  return Status::OK();
}

Status CheckGpusNotShared(const std::vector<RankRecord>& records, GpuBackend backend) {
  if (backend != GpuBackend::kNccl) return Status::OK();
  std::map<std::pair<int, std::string>, std::vector<int>> ranks_by_gpu;
  for (const RankRecord& r : records) {
    if (r.placement.gpu_bus_id.empty()) continue;
    ranks_by_gpu[{r.node_leader, r.placement.gpu_bus_id}].push_back(r.rank);
  }
  for (const auto& [gpu, ranks] : ranks_by_gpu) {
    if (ranks.size() < 2) continue;
    return Status::InvalidArgument(
        "launch check: " + RankNames(ranks) + " on host '" + records[ranks[0]].host +
        "' are bound to the same GPU (" + gpu.second +
        ") and GRADSYNC_GPU_BACKEND=nccl, but NCCL refuses two ranks on one GPU. Start at most "
        "one rank per GPU (leave GRADSYNC_GPU_DEVICE unset so each picks its GPU by local rank, "
        "or give each rank its own CUDA_VISIBLE_DEVICES), or set GRADSYNC_GPU_BACKEND=mpi");
  }
  return Status::OK();
}

}  // namespace

LauncherView ReadLauncherView(const Config::Getenv& getenv) {
  const auto get = [&](const char* name) { return getenv ? getenv(name) : std::getenv(name); };
  LauncherView view;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"}) {
    if (ParsePositive(get(name), &view.world_size)) {
      view.world_size_from = name;
      break;
    }
  }
  // Inside an srun step (not the batch script itself, which is one process of the allocation).
  const bool in_step = get("SLURM_STEP_ID") != nullptr;
  if (view.world_size < 0 && in_step &&
      ParsePositive(get("SLURM_STEP_NUM_TASKS"), &view.world_size)) {
    view.world_size_from = "SLURM_STEP_NUM_TASKS";
  }
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (ParsePositive(get(name), &view.local_size)) {
      view.local_size_from = name;
      return view;
    }
  }
  int node = -1;
  const char* node_id = get("SLURM_NODEID");
  if (in_step && node_id != nullptr && DecodeInt(node_id, &node) && node >= 0) {
    const char* per_node = get("SLURM_STEP_TASKS_PER_NODE");
    const std::vector<int> tasks = ExpandTasksPerNode(per_node ? per_node : "");
    if (node < static_cast<int>(tasks.size())) {
      view.local_size = tasks[node];
      view.local_size_from = "SLURM_STEP_TASKS_PER_NODE";
    }
  }
  return view;
}

Status CheckNotAlone(int world_size, const LauncherView& launcher) {
  if (world_size != 1 || launcher.world_size <= 1) return Status::OK();
  return Status::InvalidArgument(
      "launch check: this process is rank 0 of 1 in MPI_COMM_WORLD, but " +
      launcher.world_size_from + "=" + std::to_string(launcher.world_size) +
      " says the launcher started " + std::to_string(launcher.world_size) +
      " ranks: each process initialized MPI on its own and would train alone. Under Slurm, give "
      "srun the PMI plugin of the MPI the program is linked against (srun --mpi=pmix; "
      "srun --mpi=list shows them) or launch with gradsyncrun or mpirun inside the allocation; "
      "with mpirun, use the mpirun of the same MPI library the program is linked against");
}

Status GatherRankRecords(MPI_Comm comm, const RankRecord& mine, std::vector<RankRecord>* all) {
  int size = 0;
  GRADSYNC_MPI_CALL(MPI_Comm_size(comm, &size));
  const std::string encoded = Encode(mine);
  int length = static_cast<int>(encoded.size());
  std::vector<int> lengths(size);
  GRADSYNC_MPI_CALL(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
  std::vector<int> offsets(size);
  int total = 0;
  for (int i = 0; i < size; ++i) {
    offsets[i] = total;
    total += lengths[i];
  }
  std::string gathered(static_cast<size_t>(total), '\0');
  GRADSYNC_MPI_CALL(MPI_Allgatherv(encoded.data(), length, MPI_CHAR, gathered.data(),
                                   lengths.data(), offsets.data(), MPI_CHAR, comm));
  all->assign(size, RankRecord());
  for (int i = 0; i < size; ++i) {
    if (!Decode(gathered.substr(offsets[i], lengths[i]), &(*all)[i]) || (*all)[i].rank != i) {
      return Status::CorruptMessage("launch check: rank " + std::to_string(i) +
                                    "'s description of itself could not be read");
    }
  }
  return Status::OK();
}

Status CheckRankRecords(const std::vector<RankRecord>& records, GpuBackend gpu_backend,
                        bool check_launcher_sizes) {
  GRADSYNC_RETURN_IF_ERROR(CheckHostsMatchNodes(records));
  if (check_launcher_sizes) GRADSYNC_RETURN_IF_ERROR(CheckLauncherLocalSizes(records));
  return CheckGpusNotShared(records, gpu_backend);
}

}  // namespace gradsync
