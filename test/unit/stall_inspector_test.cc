#include "coordinator/stall_inspector.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

Request RequestFrom(const std::string& name, int rank) {
  Request r;
  r.name = name;
  r.rank = rank;
  return r;
}

TEST(StallInspectorTest, WarnsAfterTheWarningTimeNamingMissingRanks) {
  ReadinessTable table(4);
  table.Add(RequestFrom("grad", 0), 0.0);
  table.Add(RequestFrom("grad", 2), 0.0);
  StallInspector inspector(10.0, 60.0);
  std::string warning;
  EXPECT_TRUE(inspector.Inspect(table, 5.0, &warning).ok());
  EXPECT_TRUE(warning.empty());
  EXPECT_TRUE(inspector.Inspect(table, 11.0, &warning).ok());
  EXPECT_NE(warning.find("tensor 'grad'"), std::string::npos) << warning;
  EXPECT_NE(warning.find("missing on ranks 1, 3 (ready on 0, 2)"), std::string::npos) << warning;
}

TEST(StallInspectorTest, RepeatsTheWarningOncePerWarningPeriod) {
  ReadinessTable table(2);
  table.Add(RequestFrom("w", 0), 0.0);
  StallInspector inspector(10.0, 0.0);
  std::string warning;
  inspector.Inspect(table, 10.0, &warning);
  EXPECT_FALSE(warning.empty());
  inspector.Inspect(table, 15.0, &warning);
  EXPECT_TRUE(warning.empty());
  inspector.Inspect(table, 20.5, &warning);
  EXPECT_FALSE(warning.empty());
}

TEST(StallInspectorTest, ShutsDownAfterTheShutdownTime) {
  ReadinessTable table(3);
  table.Add(RequestFrom("a", 1), 0.0);
  StallInspector inspector(1.0, 5.0);
  EXPECT_TRUE(inspector.Inspect(table, 4.9).ok());
  const Status s = inspector.Inspect(table, 5.0);
  EXPECT_EQ(s.code(), StatusCode::kStalled);
  EXPECT_NE(s.message().find("missing on ranks 0, 2"), std::string::npos) << s.message();
}

// A process set's stall closes that set alone: its messages name the set and say so.
TEST(StallInspectorTest, AProcessSetsMessagesNameTheSet) {
  ReadinessTable table(2, {1, 3});
  table.Add(RequestFrom("a", 0), 0.0);
  StallInspector inspector(1.0, 5.0, /*set_id=*/2);
  std::string warning;
  EXPECT_TRUE(inspector.Inspect(table, 1.5, &warning).ok());
  EXPECT_EQ(warning.rfind("process set 2: stall:", 0), 0u) << warning;
  const Status s = inspector.Inspect(table, 5.0);
  ASSERT_EQ(s.code(), StatusCode::kStalled);
  EXPECT_EQ(s.message().rfind("process set 2: stalled for more than", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("the set is closed instead of hanging"), std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("gradsync shuts down"), std::string::npos) << s.message();
}

TEST(StallInspectorTest, ShutdownNamesEveryTensorPastTheWarningTime) {
  ReadinessTable table(3);
  table.Add(RequestFrom("first", 1), 0.0);
  table.Add(RequestFrom("later", 1),
            0.2);  // a cycle later: short of the shutdown time, still stuck
  table.Add(RequestFrom("fresh", 1), 0.9);  // not yet past the warning time
  StallInspector inspector(0.5, 1.0);
  const Status s = inspector.Inspect(table, 1.0);
  ASSERT_EQ(s.code(), StatusCode::kStalled);
  EXPECT_NE(s.message().find("tensor 'first' waited 1.0 s"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("tensor 'later' waited 0.8 s"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("'fresh'"), std::string::npos) << s.message();
}

TEST(StallInspectorTest, ZeroShutdownTimeNeverShutsDown) {
  ReadinessTable table(2);
  table.Add(RequestFrom("a", 0), 0.0);
  StallInspector inspector(1.0, 0.0);
  EXPECT_TRUE(inspector.Inspect(table, 1e6).ok());
}

TEST(StallInspectorTest, WaitedSecondsBackdateTheFirstSighting) {
  ReadinessTable table(2);
  Request r = RequestFrom("late", 0);
  r.waited_seconds = 8.0;
  table.Add(r, 10.0);
  StallInspector inspector(5.0, 0.0);
  std::string warning;
  inspector.Inspect(table, 10.0, &warning);
  EXPECT_NE(warning.find("waited 8.0 s"), std::string::npos) << warning;
}

TEST(StallInspectorTest, InspectionIsDueOnlyWithWaitingNames) {
  ReadinessTable table(2);
  StallInspector inspector(4.0, 0.0);
  EXPECT_FALSE(inspector.InspectionDue(table, 100.0));
  table.Add(RequestFrom("x", 0), 100.0);
  EXPECT_TRUE(inspector.InspectionDue(table, 100.0));
  inspector.Inspect(table, 100.0);
  EXPECT_FALSE(inspector.InspectionDue(table, 100.5));
  EXPECT_TRUE(inspector.InspectionDue(table, 101.0));
}

TEST(StallInspectorTest, LongListsAreCapped) {
  ReadinessTable table(2);
  for (int i = 0; i < 25; ++i) table.Add(RequestFrom("t" + std::to_string(i), 0), 0.0);
  const std::string text = DescribeStalled(table.WaitingNames(), 100.0, 1.0);
  EXPECT_NE(text.find("and 15 more"), std::string::npos) << text;
}

}  // namespace
}  // namespace gradsync
