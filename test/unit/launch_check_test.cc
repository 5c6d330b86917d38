#include "runtime/launch_check.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace gradsync {
namespace {

using Env = std::map<std::string, std::string>;

LauncherView Read(const Env& env) {
  return ReadLauncherView([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

RankRecord Record(int rank, int node_leader, int local_rank, int local_size,
                  const std::string& host) {
  RankRecord r;
  r.rank = rank;
  r.node_leader = node_leader;
  r.local_rank = local_rank;
  r.local_size = local_size;
  r.host = host;
  return r;
}

// Two hosts of two ranks each, as MPI and the hosts' names agree on them.
std::vector<RankRecord> TwoByTwo() {
  return {Record(0, 0, 0, 2, "a"), Record(1, 0, 1, 2, "a"), Record(2, 2, 0, 2, "b"),
          Record(3, 2, 1, 2, "b")};
}

TEST(LaunchCheckTest, ReadsOpenMpiMpichAndSlurmViews) {
  LauncherView view = Read({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(view.world_size, 4);
  EXPECT_EQ(view.world_size_from, "OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(view.local_size, 2);
  view = Read({{"PMI_SIZE", "8"}, {"MPI_LOCALNRANKS", "4"}});
  EXPECT_EQ(view.world_size, 8);
  EXPECT_EQ(view.local_size_from, "MPI_LOCALNRANKS");
  view = Read({{"SLURM_STEP_ID", "0"},
               {"SLURM_STEP_NUM_TASKS", "6"},
               {"SLURM_NODEID", "2"},
               {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"}});
  EXPECT_EQ(view.world_size, 6);
  EXPECT_EQ(view.world_size_from, "SLURM_STEP_NUM_TASKS");
  EXPECT_EQ(view.local_size, 1);
  EXPECT_EQ(view.local_size_from, "SLURM_STEP_TASKS_PER_NODE");
}

TEST(LaunchCheckTest, ABatchScriptOutsideAStepSaysNothing) {
  const LauncherView view = Read({{"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}});
  EXPECT_EQ(view.world_size, -1);
  EXPECT_EQ(view.local_size, -1);
}

TEST(LaunchCheckTest, MalformedLauncherValuesAreIgnored) {
  const LauncherView view = Read({{"OMPI_COMM_WORLD_SIZE", "four"},
                                  {"SLURM_STEP_ID", "0"},
                                  {"SLURM_NODEID", "0"},
                                  {"SLURM_STEP_TASKS_PER_NODE", "2(x"}});
  EXPECT_EQ(view.world_size, -1);
  EXPECT_EQ(view.local_size, -1);
}

TEST(LaunchCheckTest, ASingletonTheLauncherCountsAsOneOfManyFails) {
  LauncherView view;
  view.world_size = 4;
  view.world_size_from = "SLURM_STEP_NUM_TASKS";
  const Status status = CheckNotAlone(1, view);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("rank 0 of 1"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("SLURM_STEP_NUM_TASKS=4"), std::string::npos);
  EXPECT_NE(status.message().find("srun --mpi=pmix"), std::string::npos);
  EXPECT_TRUE(CheckNotAlone(4, view).ok());
  EXPECT_TRUE(CheckNotAlone(1, LauncherView()).ok());
}

TEST(LaunchCheckTest, AgreeingRecordsPass) {
  EXPECT_TRUE(CheckRankRecords(TwoByTwo(), GpuBackend::kNccl, true).ok());
}

TEST(LaunchCheckTest, OneHostSplitIntoTwoMemoryDomainsFails) {
  std::vector<RankRecord> records = TwoByTwo();
  records[2].host = records[3].host = "a";  // containers that share a host name, not memory
  const Status status = CheckRankRecords(records, GpuBackend::kAuto, true);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("host 'a' disagree about their local size"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("ranks 0, 1 (local size 2); ranks 2, 3 (local size 2)"),
            std::string::npos)
      << status.message();
}

TEST(LaunchCheckTest, LauncherCountingAnotherLocalSizeFails) {
  std::vector<RankRecord> records = TwoByTwo();
  for (RankRecord& r : records) r.launcher_local_size = 2;
  EXPECT_TRUE(CheckRankRecords(records, GpuBackend::kAuto, true).ok());
  records[3].launcher_local_size = 3;
  const Status status = CheckRankRecords(records, GpuBackend::kAuto, true);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("rank 3 is one of 3 ranks on its node, but MPI finds 2"),
            std::string::npos)
      << status.message();
  // gradsync on a communicator narrower than the launcher's world: counts need not agree.
  EXPECT_TRUE(CheckRankRecords(records, GpuBackend::kAuto, false).ok());
}

TEST(LaunchCheckTest, TwoRanksOnOneGpuFailUnderNcclOnly) {
  std::vector<RankRecord> records = TwoByTwo();
  for (RankRecord& r : records) r.placement.gpu_bus_id = "0000:41:00.0";  // one GPU per host
  const Status status = CheckRankRecords(records, GpuBackend::kNccl, true);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("ranks 0, 1 on host 'a' are bound to the same GPU"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("GRADSYNC_GPU_BACKEND=mpi"), std::string::npos);
  EXPECT_TRUE(CheckRankRecords(records, GpuBackend::kAuto, true).ok());
  EXPECT_TRUE(CheckRankRecords(records, GpuBackend::kMpi, true).ok());
  records[1].placement.gpu_bus_id = records[3].placement.gpu_bus_id = "0000:42:00.0";
  EXPECT_TRUE(CheckRankRecords(records, GpuBackend::kNccl, true).ok());
}

}  // namespace
}  // namespace gradsync
