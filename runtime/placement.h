// Placement: where a rank's gradsync threads (and, on request, the whole process) run on its
// node. Pure logic over a description of the node and of every rank on it, so that every case is
// unit-tested without the machine it describes; runtime/hwloc_node.h reads the real node and
// applies the result.
//
// The rules, in order:
// - A rank's locality is the CPUs near its GPU; without a GPU, the NUMA nodes its launcher bound
//   it to; unbound and without a GPU, a NUMA node chosen by local rank (ranks spread evenly).
// - GRADSYNC_BIND_PROCESS: the ranks that share a locality split its cores into equal blocks; each
//   process is bound to its block, less the block's last core when it has two or more, which is
//   kept for the background thread. A process the launcher bound already is left as it is.
// - When no rank of the node is bound (by its launcher or by GRADSYNC_BIND_PROCESS), no core is
//   known to be free: the background thread runs anywhere in its locality. Other jobs, or ranks
//   sharing the machine unseen (containers, network-namespace hosts), may be on any core.
// - The background thread goes to a core of its locality that no rank's trainer is bound to,
//   the ranks of one locality taking different ones; failing that, such a core elsewhere on the
//   node; failing that (every core bound to some rank) it shares its own rank's cores, and an
//   unbound rank's thread runs anywhere in its locality.
// - GRADSYNC_THREAD_AFFINITY pins the background thread of each local rank to the CPUs listed
//   for it, or (none) leaves it unbound.
//
// Thread safety: functions of values only.
#pragma once

#include <string>
#include <vector>

#include "gradsync/status.h"
#include "runtime/cpu_list.h"

namespace gradsync {

// The node as placement sees it.
struct NodeLayout {
  CpuList allowed;                  // every CPU this job may use on the node
  std::vector<CpuList> cores;       // each core's hardware threads, in topology order
  std::vector<CpuList> numa_nodes;  // each NUMA node's CPUs, by NUMA node index
};

// One rank of the node as it was when gradsync started; the same on every rank of the node.
struct LocalRank {
  CpuList bound_to;                // the CPUs the launcher let it run on
  bool bound_by_launcher = false;  // bound_to is narrower than the node's allowed CPUs
  int gpu = -1;                    // its GPU's index among the visible ones; -1: none
  std::string gpu_bus_id;          // that GPU's PCI bus id
  CpuList gpu_cpus;                // the CPUs near that GPU; empty when unknown
};

// GRADSYNC_THREAD_AFFINITY and GRADSYNC_BIND_PROCESS, parsed.
struct PlacementRequest {
  enum class Thread { kAuto, kUnbound, kListed };
  Thread thread = Thread::kAuto;
  std::vector<CpuList> thread_cpus_by_local_rank;  // kListed: entry i for local rank i
  bool bind_process = false;
};

struct Placement {
  std::string near;      // "GPU 1 (0000:41:00.0)", "NUMA node 0", "the node"
  CpuList locality;      // the CPUs that `near` names
  CpuList process_cpus;  // bind the process here; empty: leave it as the launcher did
  CpuList thread_cpus;   // bind the background thread here; empty: leave it unbound
  std::string why;       // how thread_cpus was chosen, for the log
};

// Parses GRADSYNC_THREAD_AFFINITY: empty for automatic placement, "none" for an unbound thread,
// or one CPU list per local rank separated by ';' ("2;3" or "0-1;8-9"), or Horovod's one CPU per
// local rank separated by ',' ("2,3").
Status ParseThreadAffinity(const char* name, const std::string& text, PlacementRequest* out);

// Places local rank `local_rank` of `ranks`. InvalidArgument when the request cannot be met on
// this node (a listed CPU outside `node.allowed`, too few entries for the local ranks).
Status PlanPlacement(const NodeLayout& node, const std::vector<LocalRank>& ranks, int local_rank,
                     const PlacementRequest& request, Placement* out);

// One line for the log: "GPU 1 (0000:41:00.0), CPUs 16-31; process bound by the launcher to
// 16-23; background thread on 24 (a free core near its GPU)".
std::string DescribePlacement(const LocalRank& rank, const Placement& placement);

}  // namespace gradsync
