// Launch checks: a launch gone wrong fails in init(), on every rank and before any collective of
// the trainer's, with a message that says how to fix it, instead of training as N unrelated jobs
// or hanging later. Also gathers what placement needs to know of the other ranks of the node.
//
// Thread safety: called once, by init(), on the caller thread.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradsync/status.h"
#include "runtime/config.h"
#include "runtime/placement.h"

namespace gradsync {

// What one rank tells the others about itself at init.
struct RankRecord {
  int rank = 0;
  int node_leader = 0;  // the lowest rank that shares memory with it (MPI's view of a node)
  int local_rank = 0;
  int local_size = 1;
  int launcher_local_size = -1;  // ranks on its node according to the launcher; -1: not said
  std::string host;
  LocalRank placement;      // its binding and GPU, for the placement of the node's ranks
  int64_t cache_bytes = 0;  // its node's last-level cache; 0 when unknown
};

// The launcher's word on how many ranks it started, and on how many share this rank's node,
// read from Open MPI's, MPICH's, PMI's and Slurm's variables.
struct LauncherView {
  int world_size = -1;          // -1: no launcher variable says
  std::string world_size_from;  // the variable that said it
  int local_size = -1;
  std::string local_size_from;
};
LauncherView ReadLauncherView(const Config::Getenv& getenv);

// An MPI world of one process that a launcher says is one of several: each process initialized
// MPI on its own (srun without PMI, or an mpirun of another MPI than the program's).
Status CheckNotAlone(int world_size, const LauncherView& launcher);

// Every rank's record, in rank order. Collective over `comm`.
Status GatherRankRecords(MPI_Comm comm, const RankRecord& mine, std::vector<RankRecord>* all);

// Ranks that one host's name puts together but MPI does not (or the reverse), a launcher that
// counts another local size than MPI, and, under the NCCL backend, two ranks of a node on one GPU.
// `check_launcher_sizes`: gradsync spans the launcher's whole world, so the counts must agree.
// Depends only on `records`, so every rank reaches the same verdict.
Status CheckRankRecords(const std::vector<RankRecord>& records, GpuBackend gpu_backend,
                        bool check_launcher_sizes);

}  // namespace gradsync
