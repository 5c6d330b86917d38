#include "coordinator/fusion_planner.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

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

Response OnDevice(Response r) {
  r.device = Device::Cuda(0);
  return r;
}

FusionSettings FromVariables(const std::map<std::string, std::string>& variables) {
  Config config;
  const Status parsed = Config::FromEnvironment(&config, [&](const char* name) -> const char* {
    auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  });
  EXPECT_TRUE(parsed.ok()) << parsed.ToString();
  return FusionSettings::From(config);
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

// Device tensors' buckets are DDP's by default: a tensor of 1 MiB, which the host plane reduces
// alone, joins the others, up to 25 MiB; only a tensor over the cap runs alone.
TEST(FusionPlannerTest, DeviceTensorsFuseIntoDdpSizedBuckets) {
  const int64_t mib = (1 << 20) / 4;  // float32 elements of 1 MiB
  std::vector<Response> host = {Allreduce("a", mib), Allreduce("b", 10), Allreduce("c", 10)};
  EXPECT_EQ(Indices(Plan(host, FusionSettings())), (std::vector<std::vector<size_t>>{{0}, {1, 2}}));
  std::vector<Response> device;
  for (const Response& r : host) device.push_back(OnDevice(r));
  EXPECT_EQ(Indices(Plan(device, FusionSettings())), (std::vector<std::vector<size_t>>{{0, 1, 2}}));
  // 12 + 12 MiB share a bucket; a third 12 MiB does not fit, and 26 MiB is over the cap.
  std::vector<Response> large = {
      OnDevice(Allreduce("x", 12 * mib)), OnDevice(Allreduce("y", 12 * mib)),
      OnDevice(Allreduce("z", 12 * mib)), OnDevice(Allreduce("huge", 26 * mib))};
  EXPECT_EQ(Indices(Plan(large, FusionSettings(), /*consecutive=*/true)),
            (std::vector<std::vector<size_t>>{{0, 1}, {2}, {3}}));
}

TEST(FusionPlannerTest, ThresholdVariablesPinDeviceBucketsToo) {
  const FusionSettings defaults = FromVariables({});
  EXPECT_EQ(defaults.fusion_threshold_bytes, 64 << 20);
  EXPECT_EQ(defaults.inplace_threshold_bytes, 256 << 10);
  EXPECT_EQ(defaults.device_fusion_threshold_bytes, kDeviceBucketBytes);
  EXPECT_EQ(defaults.device_inplace_threshold_bytes, kDeviceBucketBytes);
  // A pinned bucket size fuses device tensors up to it, none alone below it.
  const FusionSettings fusion = FromVariables({{"GRADSYNC_FUSION_THRESHOLD", "4096"}});
  EXPECT_EQ(fusion.fusion_threshold_bytes, 4096);
  EXPECT_EQ(fusion.device_fusion_threshold_bytes, 4096);
  EXPECT_EQ(fusion.device_inplace_threshold_bytes, 4096);
  EXPECT_EQ(fusion.inplace_threshold_bytes, 256 << 10);
  const FusionSettings both = FromVariables(
      {{"GRADSYNC_FUSION_THRESHOLD", "8192"}, {"GRADSYNC_INPLACE_THRESHOLD", "1024"}});
  EXPECT_EQ(both.device_fusion_threshold_bytes, 8192);
  EXPECT_EQ(both.device_inplace_threshold_bytes, 1024);
  const FusionSettings inplace = FromVariables({{"GRADSYNC_INPLACE_THRESHOLD", "0"}});
  EXPECT_EQ(inplace.device_fusion_threshold_bytes, kDeviceBucketBytes);
  EXPECT_EQ(inplace.device_inplace_threshold_bytes, 0);
  std::vector<Response> rs = {OnDevice(Allreduce("a", 10)), OnDevice(Allreduce("b", 10))};
  EXPECT_EQ(Plan(rs, inplace).size(), 2u);
}

}  // namespace
}  // namespace gradsync
