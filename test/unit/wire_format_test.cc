// Wire format tests: the documented layout, round trips and the serializer's preconditions (what
// the parsers reject: wire_format_rejection_test.cc). The hand-built messages follow
// docs/protocol.md field by field, so they pin the documented layout as well as the round trip.
#include "coordinator/wire_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "coordinator/message.h"
#include "test/unit/wire_samples.h"

namespace gradsync {
namespace {

// ---- Layout -------------------------------------------------------------------------------------

TEST(WireFormatTest, RequestListMatchesDocumentedLayout) {
  RequestList list{SomeRequests()};
  EXPECT_EQ(SerializeRequestList(list),
            Frame(kRequestKind, HandRequestPayload(list.requests).str()));
}

TEST(WireFormatTest, ResponseListMatchesDocumentedLayout) {
  ResponseList list{SomeResponses()};
  EXPECT_EQ(SerializeResponseList(list),
            Frame(kResponseKind, HandResponsePayload(list.responses).str()));
}

TEST(WireFormatTest, HeaderBytesAreLittleEndian) {
  const std::string bytes = SerializeRequestList({});
  ASSERT_EQ(bytes.size(), kWireHeaderBytes + 4);
  EXPECT_EQ(bytes.substr(0, 4), "GSYN");
  EXPECT_EQ(bytes[4], 2);  // version
  EXPECT_EQ(bytes[5], 0);
  EXPECT_EQ(bytes[6], 1);  // kind: request list
  EXPECT_EQ(bytes[8], 4);  // payload length
}

// ---- Round trips --------------------------------------------------------------------------------

TEST(WireFormatTest, EmptyListsRoundTrip) {
  RequestList requests;
  requests.requests.push_back(MakeRequest("stale"));  // parsing must replace, not append
  ASSERT_TRUE(ParseReq(SerializeRequestList({}), &requests).ok());
  EXPECT_TRUE(requests.requests.empty());

  ResponseList responses;
  responses.responses.push_back(MakeResponse("stale"));
  ASSERT_TRUE(ParseResp(SerializeResponseList({}), &responses).ok());
  EXPECT_TRUE(responses.responses.empty());
}

TEST(WireFormatTest, OneRequestRoundTrips) {
  RequestList in{{MakeRequest("grad/fc1")}};
  RequestList out;
  ASSERT_TRUE(ParseReq(SerializeRequestList(in), &out).ok());
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0], in.requests[0]);
}

TEST(WireFormatTest, OneResponseRoundTrips) {
  ResponseList in{{MakeResponse("grad/fc1")}};
  ResponseList out;
  ASSERT_TRUE(ParseResp(SerializeResponseList(in), &out).ok());
  ASSERT_EQ(out.responses.size(), 1u);
  EXPECT_EQ(out.responses[0], in.responses[0]);
}

TEST(WireFormatTest, EveryResponseTypeRoundTrips) {
  ResponseList in{SomeResponses()};
  ResponseList out;
  ASSERT_TRUE(ParseResp(SerializeResponseList(in), &out).ok());
  ASSERT_EQ(out.responses.size(), static_cast<size_t>(kNumResponseTypes));
  for (size_t i = 0; i < in.responses.size(); ++i) EXPECT_EQ(out.responses[i], in.responses[i]);
  EXPECT_EQ(out.responses[1].first_dims, (std::vector<int64_t>{8, 3, 0, 11}));
}

TEST(WireFormatTest, EdgeValuesRoundTrip) {
  Request r = MakeRequest("", {});  // empty name, scalar
  r.root = std::numeric_limits<int32_t>::min();
  r.rank = std::numeric_limits<int32_t>::max();
  r.device = Device::Cpu();
  r.prescale = -0.0;
  r.postscale = std::numeric_limits<double>::infinity();
  r.waited_seconds = std::numeric_limits<double>::denorm_min();
  Request big =
      MakeRequest(std::string("nul\0inside", 10), {std::numeric_limits<int64_t>::max() / 8, 0});
  big.dtype = DataType::kFloat64;
  big.reduce_op = ReduceOp::kProduct;
  RequestList in{{r, big}};
  RequestList out;
  ASSERT_TRUE(ParseReq(SerializeRequestList(in), &out).ok());
  ASSERT_EQ(out.requests.size(), 2u);
  EXPECT_EQ(out.requests[0], r);
  EXPECT_TRUE(std::signbit(out.requests[0].prescale));
  EXPECT_TRUE(out.requests[0].shape.empty());
  EXPECT_EQ(out.requests[1], big);
  EXPECT_EQ(out.requests[1].name.size(), 10u);
}

TEST(WireFormatTest, NanKeepsItsBits) {
  Request r = MakeRequest("nan");
  const uint64_t payload_nan = 0x7FF8000000001234ull;
  std::memcpy(&r.prescale, &payload_nan, 8);
  RequestList out;
  ASSERT_TRUE(ParseReq(SerializeRequestList({{r}}), &out).ok());
  uint64_t bits;
  std::memcpy(&bits, &out.requests[0].prescale, 8);
  EXPECT_EQ(bits, payload_nan);
}

TEST(WireFormatTest, LimitsThemselvesAreAccepted) {
  Request r =
      MakeRequest(std::string(kMaxWireNameBytes, 'n'), std::vector<int64_t>(kMaxWireDims, 1));
  RequestList out;
  ASSERT_TRUE(ParseReq(SerializeRequestList({{r}}), &out).ok());
  EXPECT_EQ(out.requests[0], r);
}

TEST(WireFormatTest, ManyEntriesRoundTrip) {
  std::mt19937_64 rng(42);
  RequestList requests;
  ResponseList responses;
  for (int i = 0; i < 3000; ++i) {
    std::vector<int64_t> shape(rng() % 5);
    for (auto& d : shape) d = static_cast<int64_t>(rng() % 4096);
    Request q = MakeRequest("model.layers." + std::to_string(i) + ".mlp.weight", shape);
    q.op = static_cast<OpType>(rng() % kNumOpTypes);
    q.dtype = static_cast<DataType>(rng() % kNumDataTypes);
    q.reduce_op = static_cast<ReduceOp>(rng() % kNumReduceOps);
    q.rank = static_cast<int32_t>(rng() % 1024);
    q.waited_seconds = static_cast<double>(rng() % 100000) / 7.0;
    requests.requests.push_back(q);

    Response p = ResponseFromRequest(q);
    if (p.type == ResponseType::kAllgather) p.first_dims.assign(rng() % 64, 5);
    responses.responses.push_back(p);
  }
  RequestList requests_out;
  ResponseList responses_out;
  ASSERT_TRUE(ParseReq(SerializeRequestList(requests), &requests_out).ok());
  ASSERT_TRUE(ParseResp(SerializeResponseList(responses), &responses_out).ok());
  ASSERT_EQ(requests_out.requests.size(), requests.requests.size());
  ASSERT_EQ(responses_out.responses.size(), responses.responses.size());
  for (size_t i = 0; i < requests.requests.size(); ++i) {
    ASSERT_EQ(requests_out.requests[i], requests.requests[i]) << i;
    ASSERT_EQ(responses_out.responses[i], responses.responses[i]) << i;
  }
}

TEST(WireFormatTest, OverlongErrorIsTruncatedAtACharacterBoundary) {
  Response p = MakeResponse("x", ResponseType::kStallShutdown);
  // Two-byte characters shifted by one ASCII byte, so the limit falls inside a character.
  p.error = "!";
  while (p.error.size() < kMaxWireErrorBytes + 100) p.error += "\xC3\xA9";
  ResponseList out;
  ASSERT_TRUE(ParseResp(SerializeResponseList({{p}}), &out).ok());
  const std::string& e = out.responses[0].error;
  EXPECT_EQ(e.size(), kMaxWireErrorBytes - 1);
  EXPECT_EQ(e, p.error.substr(0, e.size()));
  EXPECT_EQ(static_cast<uint8_t>(e.back()), 0xA9);  // ends on a whole character
}

// ---- Serializer preconditions -------------------------------------------------------------------

TEST(WireFormatDeathTest, UnserializableRequestsAbort) {
  EXPECT_DEATH(SerializeRequestList({{MakeRequest(std::string(kMaxWireNameBytes + 1, 'n'))}}),
               "name is 65537 bytes");
  EXPECT_DEATH(SerializeRequestList({{MakeRequest("d", std::vector<int64_t>(kMaxWireDims + 1))}}),
               "65 dimensions");
  EXPECT_DEATH(SerializeRequestList({{MakeRequest("n", {2, -1})}}), "negative dimension -1");
  EXPECT_DEATH(SerializeRequestList({{MakeRequest("o", {int64_t{1} << 62, 4})}}),
               "byte count overflows");
}

}  // namespace
}  // namespace gradsync
