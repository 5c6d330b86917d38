// The message helpers: equality, the response a request agrees to, a request from an entry, and
// what a response cache hit needs.
#include "coordinator/message.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test/unit/message_samples.h"

namespace gradsync {
namespace {

TEST(MessageTest, EqualityComparesEveryField) {
  const Request base = MakeRequest("a");
  EXPECT_EQ(base, MakeRequest("a"));
  std::vector<Request> variants(11, base);
  variants[0].name = "b";
  variants[1].op = OpType::kBroadcast;
  variants[2].dtype = DataType::kFloat32;
  variants[3].shape = {4, 4};
  variants[4].device = Device::Cuda(2);
  variants[5].reduce_op = ReduceOp::kSum;
  variants[6].prescale = 0.25;
  variants[7].postscale = 1.0;
  variants[8].root = 0;
  variants[9].rank = 0;
  variants[10].waited_seconds = 0.0;
  for (size_t i = 0; i < variants.size(); ++i) EXPECT_FALSE(variants[i] == base) << i;

  const Response rbase = MakeResponse("a");
  EXPECT_EQ(rbase, MakeResponse("a"));
  std::vector<Response> rvariants(11, rbase);
  rvariants[0].type = ResponseType::kError;
  rvariants[1].name = "b";
  rvariants[2].dtype = DataType::kInt8;
  rvariants[3].shape = {};
  rvariants[4].device = Device::Cuda(0);
  rvariants[5].reduce_op = ReduceOp::kMin;
  rvariants[6].prescale = 2.5;
  rvariants[7].postscale = 0.0;
  rvariants[8].root = 3;
  rvariants[9].first_dims = {1};
  rvariants[10].error = "x";
  for (size_t i = 0; i < rvariants.size(); ++i) EXPECT_FALSE(rvariants[i] == rbase) << i;
}

TEST(MessageTest, ResponseTypeForEveryOp) {
  EXPECT_EQ(ResponseTypeFor(OpType::kAllreduce), ResponseType::kAllreduce);
  EXPECT_EQ(ResponseTypeFor(OpType::kAllgather), ResponseType::kAllgather);
  EXPECT_EQ(ResponseTypeFor(OpType::kBroadcast), ResponseType::kBroadcast);
  EXPECT_EQ(ResponseTypeFor(OpType::kBarrier), ResponseType::kBarrier);
}

TEST(MessageTest, ResponseFromRequestCopiesAgreedParameters) {
  Request q = MakeRequest("w");
  q.op = OpType::kBroadcast;
  const Response p = ResponseFromRequest(q);
  EXPECT_EQ(p.type, ResponseType::kBroadcast);
  EXPECT_EQ(p.name, q.name);
  EXPECT_EQ(p.dtype, q.dtype);
  EXPECT_EQ(p.shape, q.shape);
  EXPECT_EQ(p.device, q.device);
  EXPECT_EQ(p.reduce_op, q.reduce_op);
  EXPECT_EQ(p.prescale, q.prescale);
  EXPECT_EQ(p.postscale, q.postscale);
  EXPECT_EQ(p.root, q.root);
  EXPECT_TRUE(p.first_dims.empty());
  EXPECT_TRUE(p.error.empty());
  EXPECT_TRUE(ResponseMatches(p, FieldsOf(q)));
}

TEST(MessageTest, RequestFromEntry) {
  TensorEntry e;
  e.name = "conv.bias";
  e.op = OpType::kAllgather;
  e.input = TensorView(nullptr, DataType::kInt64, {9, 2}, Device::Cuda(1));
  e.output = TensorView(nullptr, DataType::kFloat32, {1});  // must not leak into the request
  e.reduce_op = ReduceOp::kMin;
  e.prescale = 4.0;
  e.postscale = 0.125;
  e.root = 3;
  Request q;
  q.name = "a stale name from the request's last use";
  q.shape = {1, 2, 3, 4};
  RequestFromEntry(e, 5, 1.5, &q);
  EXPECT_EQ(q.name, "conv.bias");
  EXPECT_EQ(q.op, OpType::kAllgather);
  EXPECT_EQ(q.dtype, DataType::kInt64);
  EXPECT_EQ(q.shape, (std::vector<int64_t>{9, 2}));
  EXPECT_EQ(q.device, Device::Cuda(1));
  EXPECT_EQ(q.reduce_op, ReduceOp::kMin);
  EXPECT_EQ(q.prescale, 4.0);
  EXPECT_EQ(q.postscale, 0.125);
  EXPECT_EQ(q.root, 3);
  EXPECT_EQ(q.rank, 5);
  EXPECT_EQ(q.waited_seconds, 1.5);
}

TEST(MessageTest, CacheHitNeedsEveryAgreedParameter) {
  const Request q = MakeRequest("a");
  const Response p = ResponseFromRequest(q);
  Request other_rank = q;
  other_rank.rank = 0;
  other_rank.waited_seconds = 99.0;
  EXPECT_TRUE(ResponseMatches(p, FieldsOf(other_rank)));  // sender and wait time are not parameters
  Request own_gpu = q;
  own_gpu.device = Device::Cuda(q.device.index + 1);
  EXPECT_TRUE(ResponseMatches(p, FieldsOf(own_gpu)));  // nor which GPU: each rank's is its own

  std::vector<Request> misses(9, q);
  misses[0].name = "b";
  misses[1].op = OpType::kBroadcast;
  misses[2].dtype = DataType::kFloat32;
  misses[3].shape = {4, 3, 1};
  misses[4].device = Device::Cpu();
  misses[5].reduce_op = ReduceOp::kSum;
  misses[6].prescale = 1.0;
  misses[7].postscale = 0.5;
  misses[8].root = 0;
  for (size_t i = 0; i < misses.size(); ++i)
    EXPECT_FALSE(ResponseMatches(p, FieldsOf(misses[i]))) << i;

  Response error = p;
  error.type = ResponseType::kError;
  EXPECT_FALSE(ResponseMatches(error, FieldsOf(q)));
}

TEST(MessageTest, AllgatherCacheHitUsesTheSendersOwnFirstDim) {
  Request q = MakeRequest("g", {2, 5});
  q.op = OpType::kAllgather;
  q.rank = 0;
  Response p = ResponseFromRequest(q);  // rank 0's shape
  p.first_dims = {2, 7, 3};

  Request r1 = q;
  r1.rank = 1;
  r1.shape = {7, 5};
  EXPECT_TRUE(ResponseMatches(p, FieldsOf(q)));
  EXPECT_TRUE(ResponseMatches(p, FieldsOf(r1)));
  r1.shape = {2, 5};  // rank 0's shape, but not what rank 1 sent last time
  EXPECT_FALSE(ResponseMatches(p, FieldsOf(r1)));
  r1.shape = {7, 6};
  EXPECT_FALSE(ResponseMatches(p, FieldsOf(r1)));
  r1.rank = 3;  // beyond first_dims
  r1.shape = {7, 5};
  EXPECT_FALSE(ResponseMatches(p, FieldsOf(r1)));
}

}  // namespace
}  // namespace gradsync
