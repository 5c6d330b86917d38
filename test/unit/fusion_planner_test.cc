#include "coordinator/fusion_planner.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

Response Allreduce(const std::string& name, int64_t elements, DataType dtype = DataType::kFloat32) {
  Response r;
  r.name = name;
  r.type = ResponseType::kAllreduce;
  r.dtype = dtype;
  r.shape = {elements};
  return r;
}

std::vector<Bucket> Plan(const std::vector<Response>& responses, const FusionSettings& settings,
                         bool consecutive = false) {
  std::vector<const Response*> pointers;
  for (const Response& r : responses) pointers.push_back(&r);
  return PlanFusion(pointers, settings, consecutive);
}

std::vector<std::vector<size_t>> Indices(const std::vector<Bucket>& buckets) {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : buckets) out.push_back(b.responses);
  return out;
}

TEST(FusionPlannerTest, EmptyInputGivesNoBuckets) {
  EXPECT_TRUE(Plan({}, FusionSettings()).empty());
}

TEST(FusionPlannerTest, SmallCompatibleTensorsShareOneBucket) {
  std::vector<Response> rs;
  for (int i = 0; i < 300; ++i) rs.push_back(Allreduce("t" + std::to_string(i), 256));
  const auto buckets = Plan(rs, FusionSettings());
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].responses.size(), 300u);
}

TEST(FusionPlannerTest, ThresholdSplitsBucketsAtAlignedSizes) {
  // 100 bytes each pads to 128: two fit in 256, a third does not.
  FusionSettings s{256, 1 << 20};
  std::vector<Response> rs = {Allreduce("a", 25), Allreduce("b", 25), Allreduce("c", 25)};
  EXPECT_EQ(Indices(Plan(rs, s)), (std::vector<std::vector<size_t>>{{0, 1}, {2}}));
}

TEST(FusionPlannerTest, LargeTensorsRunAloneInPlace) {
  FusionSettings s{64 << 20, 4096};
  std::vector<Response> rs = {Allreduce("small1", 10), Allreduce("big", 1024),
                              Allreduce("small2", 10)};
  EXPECT_EQ(Indices(Plan(rs, s)), (std::vector<std::vector<size_t>>{{0, 2}, {1}}));
}

// A locked step's plan: a bucket never reaches past a tensor that could not join it, so each
// bucket fills in the order the step makes its tensors.
TEST(FusionPlannerTest, ConsecutivePlansCloseABucketAtEachTensorThatCannotJoin) {
  FusionSettings s{256, 4096};
  std::vector<Response> rs = {Allreduce("small1", 10),
                              Allreduce("small2", 10),
                              Allreduce("big", 1024),
                              Allreduce("small3", 10),
                              Allreduce("half", 10, DataType::kFloat16),
                              Allreduce("small4", 10),
                              Allreduce("a", 25),
                              Allreduce("b", 25),
                              Allreduce("c", 25)};
  EXPECT_EQ(Indices(Plan(rs, s, /*consecutive=*/true)),
            (std::vector<std::vector<size_t>>{{0, 1}, {2}, {3}, {4}, {5, 6}, {7, 8}}));
  // By class, the same responses share buckets across the others.
  EXPECT_EQ(Indices(Plan(rs, s)),
            (std::vector<std::vector<size_t>>{{0, 1, 3, 5}, {2}, {4}, {6, 7}, {8}}));
}

TEST(FusionPlannerTest, ZeroThresholdDisablesFusion) {
  FusionSettings s{0, 1 << 20};
  std::vector<Response> rs = {Allreduce("a", 1), Allreduce("b", 1)};
  EXPECT_EQ(Plan(rs, s).size(), 2u);
}

TEST(FusionPlannerTest, IncompatibleParametersNeverShareABucket) {
  std::vector<Response> rs = {Allreduce("f32", 4), Allreduce("f64", 4, DataType::kFloat64),
                              Allreduce("max", 4), Allreduce("scaled", 4), Allreduce("f32b", 4)};
  rs[2].reduce_op = ReduceOp::kMax;
  rs[3].postscale = 0.5;
  EXPECT_EQ(Indices(Plan(rs, FusionSettings())),
            (std::vector<std::vector<size_t>>{{0, 4}, {1}, {2}, {3}}));
}

TEST(FusionPlannerTest, OtherCollectivesAndErrorsArePlannedSeparately) {
  std::vector<Response> rs = {Allreduce("a", 4), Allreduce("bcast", 4), Allreduce("err", 4),
                              Allreduce("b", 4)};
  rs[1].type = ResponseType::kBroadcast;
  rs[2].type = ResponseType::kError;
  EXPECT_EQ(Indices(Plan(rs, FusionSettings())), (std::vector<std::vector<size_t>>{{0, 3}, {1}}));
}

TEST(FusionPlannerTest, ZeroElementTensorsAreFused) {
  std::vector<Response> rs = {Allreduce("empty", 0), Allreduce("one", 1)};
  EXPECT_EQ(Plan(rs, FusionSettings()).size(), 1u);
}

}  // namespace
}  // namespace gradsync
