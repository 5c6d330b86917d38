#include "runtime/placement.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

CpuList Cpus(const std::string& text) {
  CpuList cpus;
  EXPECT_TRUE(CpuList::Parse(text, &cpus).ok()) << text;
  return cpus;
}

// Two sockets of 4 cores with 2 hardware threads each: core i is CPUs i and i+8; NUMA node 0
// holds cores 0-3, node 1 cores 4-7.
NodeLayout TwoSockets() {
  NodeLayout node;
  node.allowed = Cpus("0-15");
  for (int core = 0; core < 8; ++core) node.cores.push_back(CpuList({core, core + 8}));
  node.numa_nodes = {Cpus("0-3,8-11"), Cpus("4-7,12-15")};
  return node;
}

// `cores` cores of one hardware thread each, one NUMA node.
NodeLayout Flat(int cores) {
  NodeLayout node;
  for (int core = 0; core < cores; ++core) node.cores.push_back(CpuList({core}));
  node.allowed = Cpus("0-" + std::to_string(cores - 1));
  node.numa_nodes = {node.allowed};
  return node;
}

LocalRank Unbound(const NodeLayout& node) {
  LocalRank rank;
  rank.bound_to = node.allowed;
  return rank;
}

LocalRank BoundTo(const std::string& cpus) {
  LocalRank rank;
  rank.bound_to = Cpus(cpus);
  rank.bound_by_launcher = true;
  return rank;
}

LocalRank WithGpu(LocalRank rank, int gpu, const std::string& near) {
  rank.gpu = gpu;
  rank.gpu_bus_id = "0000:" + std::to_string(10 + gpu) + ":00.0";
  rank.gpu_cpus = Cpus(near);
  return rank;
}

Placement Place(const NodeLayout& node, const std::vector<LocalRank>& ranks, int local_rank,
                const PlacementRequest& request = {}) {
  Placement placement;
  const Status status = PlanPlacement(node, ranks, local_rank, request, &placement);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return placement;
}

TEST(PlacementTest, UnboundRanksWithoutGpusSpreadOverNumaNodes) {
  const NodeLayout node = TwoSockets();
  const std::vector<LocalRank> ranks = {Unbound(node), Unbound(node)};
  const Placement first = Place(node, ranks, 0);
  const Placement second = Place(node, ranks, 1);
  EXPECT_EQ(first.near, "NUMA node 0");
  EXPECT_EQ(second.near, "NUMA node 1");
  // No rank is bound, so no core is known to be free: each thread runs anywhere in its node.
  EXPECT_EQ(first.thread_cpus, Cpus("0-3,8-11"));
  EXPECT_EQ(second.thread_cpus, Cpus("4-7,12-15"));
  EXPECT_TRUE(first.process_cpus.empty());
}

// One rank per node, unbound, as on hosts that share a machine's cores unseen (containers,
// network namespaces): pinning each to "its" free core would put them all on the same one.
TEST(PlacementTest, LoneUnboundRankLeavesItsThreadToTheScheduler) {
  const NodeLayout node = Flat(2);
  const std::vector<LocalRank> ranks = {Unbound(node)};
  const Placement p = Place(node, ranks, 0);
  EXPECT_EQ(p.thread_cpus, Cpus("0-1"));
  EXPECT_NE(p.why.find("no rank of the node is bound"), std::string::npos) << p.why;
}

TEST(PlacementTest, ThreadGoesNearTheRanksGpu) {
  const NodeLayout node = TwoSockets();
  // Local rank 0 drives the GPU on the second socket, local rank 1 the one on the first.
  const std::vector<LocalRank> ranks = {WithGpu(Unbound(node), 1, "4-7,12-15"),
                                        WithGpu(Unbound(node), 0, "0-3,8-11")};
  const Placement first = Place(node, ranks, 0);
  EXPECT_EQ(first.near, "GPU 1 (0000:11:00.0)");
  EXPECT_EQ(first.locality, Cpus("4-7,12-15"));
  EXPECT_TRUE(first.thread_cpus.IsSubsetOf(first.locality));
  EXPECT_TRUE(Place(node, ranks, 1).thread_cpus.IsSubsetOf(Cpus("0-3,8-11")));
}

TEST(PlacementTest, RanksSharingALocalityTakeDifferentCores) {
  const NodeLayout node = TwoSockets();
  // Each rank bound by its launcher to one core of its GPU's socket.
  const char* cores[] = {"0,8", "4,12", "1,9", "5,13"};
  std::vector<LocalRank> ranks;
  for (int i = 0; i < 4; ++i)
    ranks.push_back(WithGpu(BoundTo(cores[i]), i % 2, i % 2 ? "4-7,12-15" : "0-3,8-11"));
  const Placement r0 = Place(node, ranks, 0);
  const Placement r2 = Place(node, ranks, 2);
  EXPECT_TRUE(r0.thread_cpus.IsSubsetOf(Cpus("0-3,8-11")));
  EXPECT_TRUE(r2.thread_cpus.IsSubsetOf(Cpus("0-3,8-11")));
  EXPECT_FALSE(r0.thread_cpus.Intersects(r2.thread_cpus));
}

TEST(PlacementTest, ThreadNeverLandsOnCoresTheLauncherBoundTrainersTo) {
  const NodeLayout node = TwoSockets();
  const std::vector<LocalRank> ranks = {BoundTo("0,8"), BoundTo("1,9")};
  const Placement first = Place(node, ranks, 0);
  const Placement second = Place(node, ranks, 1);
  EXPECT_EQ(first.near, "NUMA node 0");
  for (const Placement& p : {first, second}) {
    EXPECT_FALSE(p.thread_cpus.Intersects(Cpus("0-1,8-9"))) << p.thread_cpus.ToString();
    EXPECT_TRUE(p.thread_cpus.IsSubsetOf(Cpus("0-3,8-11"))) << p.thread_cpus.ToString();
  }
  EXPECT_FALSE(first.thread_cpus.Intersects(second.thread_cpus));
}

TEST(PlacementTest, NoFreeCoreNearbyTakesAFreeCoreElsewhere) {
  const NodeLayout node = TwoSockets();
  const std::vector<LocalRank> ranks = {BoundTo("0-3,8-11")};  // the whole first socket
  const Placement p = Place(node, ranks, 0);
  EXPECT_TRUE(p.thread_cpus.IsSubsetOf(Cpus("4-7,12-15"))) << p.thread_cpus.ToString();
  EXPECT_NE(p.why.find("no free core near"), std::string::npos) << p.why;
}

TEST(PlacementTest, EveryCoreBoundSharesTheRanksOwnCores) {
  const NodeLayout node = Flat(2);
  const std::vector<LocalRank> ranks = {BoundTo("0"), BoundTo("1")};
  EXPECT_EQ(Place(node, ranks, 0).thread_cpus, Cpus("0"));
  const Placement second = Place(node, ranks, 1);
  EXPECT_EQ(second.thread_cpus, Cpus("1"));
  EXPECT_NE(second.why.find("shares its own rank's cores"), std::string::npos) << second.why;
}

TEST(PlacementTest, MoreUnboundRanksThanCoresLeaveThreadsAnywhereNearby) {
  const NodeLayout node = Flat(2);
  const std::vector<LocalRank> ranks(4, Unbound(node));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Place(node, ranks, i).thread_cpus, Cpus("0-1")) << i;
}

TEST(PlacementTest, BindProcessSplitsTheLocalityAndKeepsACoreForTheThread) {
  const NodeLayout node = Flat(8);
  const std::vector<LocalRank> ranks = {Unbound(node), Unbound(node)};
  PlacementRequest request;
  request.bind_process = true;
  const Placement first = Place(node, ranks, 0, request);
  const Placement second = Place(node, ranks, 1, request);
  EXPECT_EQ(first.process_cpus, Cpus("0-2"));
  EXPECT_EQ(first.thread_cpus, Cpus("3"));
  EXPECT_EQ(second.process_cpus, Cpus("4-6"));
  EXPECT_EQ(second.thread_cpus, Cpus("7"));
}

TEST(PlacementTest, BindProcessWithOneCoreEachSharesIt) {
  const NodeLayout node = Flat(2);
  const std::vector<LocalRank> ranks = {Unbound(node), Unbound(node)};
  PlacementRequest request;
  request.bind_process = true;
  const Placement second = Place(node, ranks, 1, request);
  EXPECT_EQ(second.process_cpus, Cpus("1"));
  EXPECT_EQ(second.thread_cpus, Cpus("1"));
}

TEST(PlacementTest, BindProcessLeavesALauncherBindingAlone) {
  const NodeLayout node = Flat(4);
  const std::vector<LocalRank> ranks = {BoundTo("0"), Unbound(node)};
  PlacementRequest request;
  request.bind_process = true;
  const Placement first = Place(node, ranks, 0, request);
  EXPECT_TRUE(first.process_cpus.empty());
  EXPECT_FALSE(first.thread_cpus.Contains(0));
  const Placement second = Place(node, ranks, 1, request);
  EXPECT_FALSE(second.process_cpus.empty());
  EXPECT_FALSE(second.process_cpus.Contains(0)) << second.process_cpus.ToString();
}

TEST(PlacementTest, ThreadAffinityListPinsEachLocalRank) {
  const NodeLayout node = Flat(4);
  const std::vector<LocalRank> ranks = {BoundTo("0"), BoundTo("1")};
  PlacementRequest request;
  ASSERT_TRUE(ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", "3,2", &request).ok());
  EXPECT_EQ(Place(node, ranks, 0, request).thread_cpus, Cpus("3"));
  EXPECT_EQ(Place(node, ranks, 1, request).thread_cpus, Cpus("2"));
  ASSERT_TRUE(ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", "0-1;2-3", &request).ok());
  EXPECT_EQ(Place(node, ranks, 1, request).thread_cpus, Cpus("2-3"));
  ASSERT_TRUE(ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", "none", &request).ok());
  EXPECT_TRUE(Place(node, ranks, 1, request).thread_cpus.empty());
  // One local rank's list of CPUs apart: a trailing ';' says it is one list.
  const std::vector<LocalRank> one = {BoundTo("0")};
  ASSERT_TRUE(ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", "1,3;", &request).ok());
  ASSERT_EQ(request.thread_cpus_by_local_rank.size(), 1u);
  EXPECT_EQ(Place(node, one, 0, request).thread_cpus, Cpus("1,3"));
}

TEST(PlacementTest, ThreadAffinityListMustCoverTheNodeAndItsCpus) {
  const NodeLayout node = Flat(4);
  const std::vector<LocalRank> ranks = {Unbound(node), Unbound(node)};
  PlacementRequest request;
  Placement placement;
  ASSERT_TRUE(ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", "1", &request).ok());
  Status status = PlanPlacement(node, ranks, 0, request, &placement);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("1 local rank(s), but this node runs 2"), std::string::npos)
      << status.message();
  ASSERT_TRUE(ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", "1,9", &request).ok());
  status = PlanPlacement(node, ranks, 1, request, &placement);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("CPUs 9"), std::string::npos) << status.message();
}

TEST(PlacementTest, ParseThreadAffinityRejectsGarbage) {
  PlacementRequest request;
  for (const char* bad : {"auto", "1,,2", "2-1", "1;;2", ";", "x"}) {
    const Status status = ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", bad, &request);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
  }
  ASSERT_TRUE(ParseThreadAffinity("GRADSYNC_THREAD_AFFINITY", "", &request).ok());
  EXPECT_EQ(request.thread, PlacementRequest::Thread::kAuto);
}

TEST(PlacementTest, DescriptionSaysWhereAndWhy) {
  const NodeLayout node = Flat(4);
  const std::vector<LocalRank> ranks = {BoundTo("0"), BoundTo("1")};
  const std::string line = DescribePlacement(ranks[1], Place(node, ranks, 1));
  EXPECT_NE(line.find("NUMA node 0, CPUs 0-3"), std::string::npos) << line;
  EXPECT_NE(line.find("process bound by the launcher to 1"), std::string::npos) << line;
  EXPECT_NE(line.find("background thread on 3"), std::string::npos) << line;
}

TEST(PlacementTest, OutOfRangeLocalRankIsAnInternalError) {
  Placement placement;
  EXPECT_EQ(PlanPlacement(Flat(1), {}, 0, {}, &placement).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace gradsync
