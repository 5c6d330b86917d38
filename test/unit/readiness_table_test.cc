#include "coordinator/readiness_table.h"

#include <gtest/gtest.h>

#include "coordinator/stall_inspector.h"

namespace gradsync {
namespace {

Request From(const std::string& name, int rank, OpType op = OpType::kAllreduce) {
  Request r;
  r.name = name;
  r.rank = rank;
  r.op = op;
  r.shape = {4};
  return r;
}

std::vector<std::string> Runnable(ReadinessTable* table) {
  std::vector<std::string> names;
  table->TakeRunnable(&names);
  return names;
}

TEST(ReadinessTableTest, NameRunsOnceEveryRankHasSentIt) {
  ReadinessTable table(3);
  EXPECT_FALSE(table.Add(From("a", 0), 0.0));
  EXPECT_FALSE(table.Add(From("a", 2), 0.0));
  EXPECT_TRUE(Runnable(&table).empty());
  EXPECT_TRUE(table.Add(From("a", 1), 0.0));
  EXPECT_EQ(Runnable(&table), std::vector<std::string>{"a"});
  EXPECT_EQ(table.TakeReady("a").type, ResponseType::kAllreduce);
  EXPECT_TRUE(table.empty());
}

TEST(ReadinessTableTest, JoiningCompletesWhatWaitedOnlyForTheJoinedRank) {
  ReadinessTable table(3);
  table.Add(From("a", 0), 0.0);
  table.Add(From("a", 1), 0.0);
  table.Add(From("b", 0), 0.0);  // still missing on rank 1 after rank 2 joins
  EXPECT_FALSE(table.Add(From("gradsync.join", 2, OpType::kJoin), 0.0));
  EXPECT_EQ(Runnable(&table), std::vector<std::string>{"a"});
  EXPECT_EQ(table.JoinedRanks(), std::vector<int>{2});
  const Response a = table.TakeReady("a");
  EXPECT_EQ(a.type, ResponseType::kAllreduce) << a.error;
  // While rank 2 is joined, a new name needs only ranks 0 and 1.
  table.Add(From("c", 1), 0.0);
  EXPECT_TRUE(table.Add(From("c", 0), 0.0));
  EXPECT_EQ(Runnable(&table), std::vector<std::string>{"c"});
  table.TakeReady("c");
  // The stall inspector sees rank 1 missing for "b", but neither the joined rank nor the join.
  const std::vector<ReadinessTable::Waiting> waiting = table.WaitingNames();
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(waiting[0].name, "b");
  EXPECT_EQ(waiting[0].missing_ranks, std::vector<int>{1});
}

// Broadcast roots travel as ranks within the set; a mismatch names them as the callers gave them,
// global ranks, beside the ranks' own labels.
TEST(ReadinessTableTest, MismatchedRootsInAProcessSetAreNamedAsGlobalRanks) {
  ReadinessTable table(2, {1, 3});
  Request a = From("b", 0, OpType::kBroadcast);
  Request b = From("b", 1, OpType::kBroadcast);
  a.root = 1;  // global rank 3
  b.root = 0;  // global rank 1
  table.Add(a, 0.0);
  table.Add(b, 0.0);
  Runnable(&table);
  const Response r = table.TakeReady("b");
  EXPECT_NE(r.error.find("rank 1 has 3; rank 3 has 1"), std::string::npos) << r.error;
}

TEST(ReadinessTableTest, JoinRunsOnceEveryRankJoinedAndNamesTheLast) {
  ReadinessTable table(3);
  table.Add(From("gradsync.join", 1, OpType::kJoin), 0.0);
  table.Add(From("gradsync.join", 0, OpType::kJoin), 0.0);
  EXPECT_TRUE(Runnable(&table).empty());
  EXPECT_TRUE(table.Add(From("gradsync.join", 2, OpType::kJoin), 0.0));
  EXPECT_EQ(Runnable(&table), std::vector<std::string>{"gradsync.join"});
  const Response join = table.TakeReady("gradsync.join");
  EXPECT_EQ(join.type, ResponseType::kJoin);
  EXPECT_EQ(join.root, 2);
  // Everyone is unjoined again.
  EXPECT_TRUE(table.JoinedRanks().empty());
  EXPECT_FALSE(table.Add(From("d", 0), 0.0));
}

TEST(ReadinessTableTest, AFailedJoinStillEndsTheJoin) {
  ReadinessTable table(2);
  table.Add(From("gradsync.join", 0, OpType::kJoin), 0.0);
  table.Add(From("gradsync.join", 1), 0.0);  // an allreduce of the same name: a mismatch
  EXPECT_EQ(Runnable(&table), std::vector<std::string>{"gradsync.join"});
  EXPECT_EQ(table.TakeReady("gradsync.join").type, ResponseType::kError);
  EXPECT_TRUE(table.JoinedRanks().empty());
  EXPECT_FALSE(table.Add(From("e", 1), 0.0)) << "rank 0 must be waited for again";
}

TEST(ReadinessTableTest, CollectivesThatCannotJoinFailNamingTheJoinedRanks) {
  ReadinessTable table(3);
  table.Add(From("gradsync.join", 0, OpType::kJoin), 0.0);
  for (OpType op :
       {OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall, OpType::kReducescatter}) {
    const std::string name = OpTypeName(op) + ".x";
    table.Add(From(name, 1, op), 0.0);
    table.Add(From(name, 2, op), 0.0);
    EXPECT_EQ(Runnable(&table), std::vector<std::string>{name});
    const Response r = table.TakeReady(name);
    EXPECT_EQ(r.type, ResponseType::kError) << OpTypeName(op);
    EXPECT_NE(r.error.find("cannot run while rank 0 has joined"), std::string::npos) << r.error;
  }
  // A barrier runs: the joined rank counts as arrived.
  table.Add(From("bar", 1, OpType::kBarrier), 0.0);
  table.Add(From("bar", 2, OpType::kBarrier), 0.0);
  EXPECT_EQ(Runnable(&table), std::vector<std::string>{"bar"});
  EXPECT_EQ(table.TakeReady("bar").type, ResponseType::kBarrier);
}

TEST(ReadinessTableTest, MessagesNameRanksByTheirLabels) {
  ReadinessTable table(2, {1, 3});  // a process set of global ranks 1 and 3
  Request a = From("a", 0);
  Request b = From("a", 1);
  b.dtype = DataType::kInt32;
  table.Add(a, 0.0);
  table.Add(b, 0.0);
  Runnable(&table);
  const Response r = table.TakeReady("a");
  EXPECT_NE(r.error.find("rank 1 has float32; rank 3 has int32"), std::string::npos) << r.error;
  table.Add(From("late", 1), 0.0);
  const std::vector<ReadinessTable::Waiting> waiting = table.WaitingNames();
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(waiting[0].ready_ranks, std::vector<int>{3});
  EXPECT_EQ(waiting[0].missing_ranks, std::vector<int>{1});
}

}  // namespace
}  // namespace gradsync
