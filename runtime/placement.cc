#include "runtime/placement.h"

#include <algorithm>

namespace gradsync {
namespace {

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? end : end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

CpuList UnionOf(const std::vector<CpuList>& lists) {
  CpuList all;
  for (const CpuList& list : lists) all = all.Union(list);
  return all;
}

// A rank's locality: near its GPU, else the NUMA nodes its launcher bound it to, else a NUMA node
// by local rank so that unbound ranks spread over the node.
void Locate(const NodeLayout& node, const std::vector<LocalRank>& ranks, int local_rank,
            Placement* out) {
  const LocalRank& rank = ranks[local_rank];
  if (!rank.gpu_cpus.empty()) {
    out->near = "GPU " + std::to_string(rank.gpu) + " (" + rank.gpu_bus_id + ")";
    out->locality = rank.gpu_cpus.Intersection(node.allowed);
    if (!out->locality.empty()) return;
  }
  std::vector<int> numa;
  if (rank.bound_by_launcher) {
    for (size_t i = 0; i < node.numa_nodes.size(); ++i) {
      if (node.numa_nodes[i].Intersects(rank.bound_to)) numa.push_back(static_cast<int>(i));
    }
  } else if (!node.numa_nodes.empty()) {
    const size_t n = node.numa_nodes.size();
    numa.push_back(static_cast<int>(local_rank * n / std::max<size_t>(1, ranks.size())));
  }
  CpuList cpus;
  std::string names;
  for (int i : numa) {
    cpus = cpus.Union(node.numa_nodes[i]);
    names += (names.empty() ? "" : ",") + std::to_string(i);
  }
  cpus = cpus.Intersection(node.allowed);
  if (cpus.empty()) {
    out->near = "the node";
    out->locality = node.allowed;
    return;
  }
  out->near = (numa.size() == 1 ? "NUMA node " : "NUMA nodes ") + names;
  out->locality = cpus;
}

// The node's cores whose CPUs all lie in `cpus`, in topology order.
std::vector<CpuList> CoresWithin(const NodeLayout& node, const CpuList& cpus) {
  std::vector<CpuList> cores;
  for (const CpuList& core : node.cores) {
    const CpuList usable = core.Intersection(node.allowed);
    if (!usable.empty() && usable.IsSubsetOf(cpus)) cores.push_back(usable);
  }
  return cores;
}

// The ranks that share `rank`'s locality, and `rank`'s position among them.
std::vector<int> SameLocality(const std::vector<Placement>& located, int rank, int* position) {
  std::vector<int> group;
  for (size_t i = 0; i < located.size(); ++i) {
    if (static_cast<int>(i) == rank) *position = static_cast<int>(group.size());
    if (located[i].locality == located[rank].locality) group.push_back(static_cast<int>(i));
  }
  return group;
}

// GRADSYNC_BIND_PROCESS: the rank's block of its locality's cores, less the core kept for the
// background thread (returned in *kept when the block has two or more).
CpuList ProcessBlock(const NodeLayout& node, const std::vector<Placement>& located, int rank,
                     CpuList* kept) {
  int position = 0;
  const std::vector<int> group = SameLocality(located, rank, &position);
  const std::vector<CpuList> cores = CoresWithin(node, located[rank].locality);
  if (cores.empty()) return located[rank].locality;
  const size_t per_rank = std::max<size_t>(1, cores.size() / group.size());
  const size_t first = (position * per_rank) % cores.size();
  std::vector<CpuList> block(cores.begin() + first,
                             cores.begin() + std::min(cores.size(), first + per_rank));
  if (block.size() >= 2) {
    *kept = block.back();
    block.pop_back();
  }
  return UnionOf(block);
}

// What each rank's trainer threads are bound to once placement is done; empty for an unbound one.
std::vector<CpuList> TrainerBindings(const NodeLayout& node, const std::vector<LocalRank>& ranks,
                                     const std::vector<Placement>& located, bool bind_process,
                                     std::vector<CpuList>* kept) {
  std::vector<CpuList> bindings(ranks.size());
  kept->assign(ranks.size(), CpuList());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].bound_by_launcher) {
      bindings[i] = ranks[i].bound_to;
    } else if (bind_process) {
      bindings[i] = ProcessBlock(node, located, static_cast<int>(i), &(*kept)[i]);
    }
  }
  return bindings;
}

void PlaceThread(const NodeLayout& node, const std::vector<Placement>& located,
                 const std::vector<CpuList>& trainers, const std::vector<CpuList>& kept, int rank,
                 Placement* out) {
  if (!kept[rank].empty()) {
    out->thread_cpus = kept[rank];
    out->why = "the core kept for it in its process's block";
    return;
  }
  const CpuList taken = UnionOf(trainers).Union(UnionOf(kept));
  if (taken.empty()) {
    // No rank of the node is bound, so nothing says which cores are busy: other jobs, or ranks
    // this node's gradsync cannot see (containers or namespaces sharing the machine), may be
    // running anywhere. A fixed core would be a guess that could put every such rank's thread on
    // the same core; the scheduler balances the thread better.
    out->thread_cpus = located[rank].locality;
    out->why =
        "no rank of the node is bound, so no core is known to be free: anywhere near " + out->near;
    return;
  }
  int position = 0;
  SameLocality(located, rank, &position);
  std::vector<CpuList> free_near;
  for (const CpuList& core : CoresWithin(node, located[rank].locality)) {
    if (!core.Intersects(taken)) free_near.push_back(core);
  }
  if (!free_near.empty()) {
    out->thread_cpus = free_near[position % free_near.size()];
    out->why = "a core near " + out->near + " that no rank's trainer is bound to";
    return;
  }
  std::vector<CpuList> free_anywhere;
  for (const CpuList& core : CoresWithin(node, node.allowed)) {
    if (!core.Intersects(taken)) free_anywhere.push_back(core);
  }
  if (!free_anywhere.empty()) {
    out->thread_cpus = free_anywhere[rank % free_anywhere.size()];
    out->why = "no free core near " + out->near + "; a core no rank's trainer is bound to";
    return;
  }
  if (!trainers[rank].empty()) {
    out->thread_cpus = trainers[rank];
    out->why = "every core is bound to a rank: it shares its own rank's cores";
    return;
  }
  out->thread_cpus = located[rank].locality;
  out->why =
      "every core is bound to a rank; its own rank is unbound, so anywhere near " + out->near;
}

}  // namespace

Status ParseThreadAffinity(const char* name, const std::string& text, PlacementRequest* out) {
  out->thread_cpus_by_local_rank.clear();
  if (text.empty()) {
    out->thread = PlacementRequest::Thread::kAuto;
    return Status::OK();
  }
  if (text == "none") {
    out->thread = PlacementRequest::Thread::kUnbound;
    return Status::OK();
  }
  const char separator = text.find(';') != std::string::npos ? ';' : ',';
  // A ';' at the end marks a list of CPU lists even for one local rank ("0,8;": CPUs 0 and 8).
  const std::string lists =
      separator == ';' && text.back() == ';' ? text.substr(0, text.size() - 1) : text;
  for (const std::string& part : Split(lists, separator)) {
    CpuList cpus;
    const Status parsed = CpuList::Parse(part, &cpus);
    if (!parsed.ok()) {
      return Status::InvalidArgument(
          std::string(name) + "='" + text + "': " + parsed.message() +
          "; expected none, or one CPU or range per local rank separated by ',' (\"2,3\"), or "
          "one CPU list per local rank separated by ';' (\"0-1,8;2-3,9\", or \"0,8;\" for "
          "one local rank)");
    }
    out->thread_cpus_by_local_rank.push_back(cpus);
  }
  out->thread = PlacementRequest::Thread::kListed;
  return Status::OK();
}

Status PlanPlacement(const NodeLayout& node, const std::vector<LocalRank>& ranks, int local_rank,
                     const PlacementRequest& request, Placement* out) {
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks.size())) {
    return Status::Internal("PlanPlacement: local rank " + std::to_string(local_rank) + " of " +
                            std::to_string(ranks.size()));
  }
  std::vector<Placement> located(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) Locate(node, ranks, static_cast<int>(i), &located[i]);
  Placement placement = located[local_rank];
  std::vector<CpuList> kept;
  const std::vector<CpuList> trainers =
      TrainerBindings(node, ranks, located, request.bind_process, &kept);
  if (request.bind_process && !ranks[local_rank].bound_by_launcher) {
    placement.process_cpus = trainers[local_rank];
  }
  switch (request.thread) {
    case PlacementRequest::Thread::kUnbound:
      placement.why = "unbound (GRADSYNC_THREAD_AFFINITY=none)";
      break;
    case PlacementRequest::Thread::kListed: {
      const auto& listed = request.thread_cpus_by_local_rank;
      if (listed.size() < ranks.size()) {
        return Status::InvalidArgument(
            "GRADSYNC_THREAD_AFFINITY lists CPUs for " + std::to_string(listed.size()) +
            " local rank(s), but this node runs " + std::to_string(ranks.size()) +
            ": give one entry per local rank");
      }
      if (!listed[local_rank].IsSubsetOf(node.allowed)) {
        return Status::InvalidArgument(
            "GRADSYNC_THREAD_AFFINITY gives local rank " + std::to_string(local_rank) + " CPUs " +
            listed[local_rank].ToString() + ", but this job may only use CPUs " +
            node.allowed.ToString() + " on this node");
      }
      placement.thread_cpus = listed[local_rank];
      placement.why = "GRADSYNC_THREAD_AFFINITY";
      break;
    }
    case PlacementRequest::Thread::kAuto:
      PlaceThread(node, located, trainers, kept, local_rank, &placement);
      break;
  }
  *out = placement;
  return Status::OK();
}

std::string DescribePlacement(const LocalRank& rank, const Placement& placement) {
  std::string line = placement.near + ", CPUs " + placement.locality.ToString() + "; process ";
  if (!placement.process_cpus.empty()) {
    line += "bound to " + placement.process_cpus.ToString() + " (GRADSYNC_BIND_PROCESS)";
  } else if (rank.bound_by_launcher) {
    line += "bound by the launcher to " + rank.bound_to.ToString();
  } else {
    line += "not bound";
  }
  line += "; background thread ";
  line += placement.thread_cpus.empty() ? "not bound" : "on " + placement.thread_cpus.ToString();
  return line + " (" + placement.why + ")";
}

}  // namespace gradsync
