// Wire format and message helper tests. The hand-built messages below follow docs/protocol.md field
// by field, so they pin the documented layout as well as the round trip.
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

namespace gradsync {
namespace {

// ---- Builders -----------------------------------------------------------------------------------

Request MakeRequest(const std::string& name, std::vector<int64_t> shape = {4, 3}) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = DataType::kBFloat16;
  r.shape = std::move(shape);
  r.device = Device::Cuda(3);
  r.reduce_op = ReduceOp::kAverage;
  r.prescale = 0.5;
  r.postscale = 1.0 / 3.0;
  r.root = 2;
  r.rank = 7;
  r.waited_seconds = 12.25;
  return r;
}

Response MakeResponse(const std::string& name, ResponseType type = ResponseType::kAllreduce) {
  Response p;
  p.type = type;
  p.name = name;
  p.dtype = DataType::kFloat16;
  p.shape = {8, 2, 5};
  p.device = Device::Cpu();
  p.reduce_op = ReduceOp::kMax;
  p.prescale = -2.5;
  p.postscale = 1e-300;
  p.root = 1;
  return p;
}

// Little-endian byte builder written independently of the library's Writer, straight from the spec.
// Records where entry 0's fields start so tests can patch them.
class Bytes {
 public:
  size_t size() const { return s_.size(); }
  const std::string& str() const { return s_; }
  void Mark(const std::string& field) { at_.emplace(field, s_.size()); }
  size_t At(const std::string& field) const { return at_.at(field); }

  void U8(uint8_t v) { s_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void I32(int32_t v) { Le(static_cast<uint32_t>(v), 4); }
  void I64(int64_t v) { Le(static_cast<uint64_t>(v), 8); }
  void F64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    Le(bits, 8);
  }
  void Str(const std::string& v) {
    U32(static_cast<uint32_t>(v.size()));
    s_ += v;
  }
  void Dims(const std::vector<int64_t>& dims) {
    U32(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) I64(d);
  }

 private:
  void Le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }

  std::string s_;
  std::map<std::string, size_t> at_;
};

constexpr uint16_t kRequestKind = 1;
constexpr uint16_t kResponseKind = 2;

// A complete message around `payload` with a correct length and CRC, so only the payload's own
// fields can make it invalid.
std::string Frame(uint16_t kind, const std::string& payload) {
  Bytes h;
  h.U32(kWireMagic);
  h.U16(kWireVersion);
  h.U16(kind);
  h.U32(static_cast<uint32_t>(payload.size()));
  h.U32(Crc32(payload.data(), payload.size()));
  return h.str() + payload;
}

Bytes HandRequestPayload(const std::vector<Request>& requests) {
  Bytes b;
  b.Mark("count");
  b.U32(static_cast<uint32_t>(requests.size()));
  for (const Request& r : requests) {
    b.Mark("name length");
    b.Str(r.name);
    b.Mark("op");
    b.U8(static_cast<uint8_t>(r.op));
    b.Mark("dtype");
    b.U8(static_cast<uint8_t>(r.dtype));
    b.Mark("ndims");
    b.U32(static_cast<uint32_t>(r.shape.size()));
    b.Mark("dim0");
    for (int64_t d : r.shape) b.I64(d);
    b.Mark("device kind");
    b.U8(static_cast<uint8_t>(r.device.kind));
    b.I32(r.device.index);
    b.Mark("reduce op");
    b.U8(static_cast<uint8_t>(r.reduce_op));
    b.F64(r.prescale);
    b.F64(r.postscale);
    b.I32(r.root);
    b.I32(r.rank);
    b.F64(r.waited_seconds);
    b.Mark("group length");
    b.Str(r.group);
    b.Mark("group size");
    b.I32(r.group_size);
  }
  return b;
}

Bytes HandResponsePayload(const std::vector<Response>& responses) {
  Bytes b;
  b.Mark("count");
  b.U32(static_cast<uint32_t>(responses.size()));
  for (const Response& p : responses) {
    b.Mark("type");
    b.U8(static_cast<uint8_t>(p.type));
    b.Mark("name length");
    b.Str(p.name);
    b.Mark("dtype");
    b.U8(static_cast<uint8_t>(p.dtype));
    b.Mark("ndims");
    b.U32(static_cast<uint32_t>(p.shape.size()));
    b.Mark("dim0");
    for (int64_t d : p.shape) b.I64(d);
    b.Mark("device kind");
    b.U8(static_cast<uint8_t>(p.device.kind));
    b.I32(p.device.index);
    b.Mark("reduce op");
    b.U8(static_cast<uint8_t>(p.reduce_op));
    b.F64(p.prescale);
    b.F64(p.postscale);
    b.I32(p.root);
    b.Mark("first_dims count");
    b.U32(static_cast<uint32_t>(p.first_dims.size()));
    b.Mark("first_dim0");
    for (int64_t d : p.first_dims) b.I64(d);
    b.Mark("error length");
    b.Str(p.error);
    b.Mark("group length");
    b.Str(p.group);
    b.Mark("group size");
    b.I32(p.group_size);
  }
  return b;
}

// `payload` with the little-endian `value` written over `width` bytes at `offset`.
std::string Patched(std::string payload, size_t offset, uint64_t value, int width) {
  for (int i = 0; i < width; ++i)
    payload[offset + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return payload;
}

Status ParseReq(const std::string& bytes, RequestList* out = nullptr) {
  RequestList scratch;
  return ParseRequestList(bytes.data(), bytes.size(), out ? out : &scratch);
}

Status ParseResp(const std::string& bytes, ResponseList* out = nullptr) {
  ResponseList scratch;
  return ParseResponseList(bytes.data(), bytes.size(), out ? out : &scratch);
}

// Asserts a CorruptMessage whose text contains `needle`.
::testing::AssertionResult IsCorrupt(const Status& s, const std::string& needle = "") {
  if (s.code() != StatusCode::kCorruptMessage) {
    return ::testing::AssertionFailure() << "expected CorruptMessage, got " << s.ToString();
  }
  if (s.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << s.message();
  }
  return ::testing::AssertionSuccess();
}

std::vector<Request> SomeRequests() {
  std::vector<Request> v = {
      MakeRequest("layer1.weight"), MakeRequest("", {}),
      MakeRequest("\xCE\xB1\xCE\xB2/\xE6\xA2\xAF\xE5\xBA\xA6 \xF0\x9F\x98\x80")};
  v[1].op = OpType::kBarrier;
  v[1].device = Device::Cpu();
  v[2].op = OpType::kAllgather;
  v[2].shape = {0, 7};
  v[0].group = "layer1.weight";
  v[0].group_size = 3;
  return v;
}

std::vector<Response> SomeResponses() {
  std::vector<Response> v;
  for (int t = 0; t < kNumResponseTypes; ++t) {
    v.push_back(MakeResponse("t" + std::to_string(t), static_cast<ResponseType>(t)));
  }
  v[1].first_dims = {8, 3, 0, 11};
  v[4].error = "tensor 't4': dtype mismatch: rank 0 has float16, ranks 1, 2 have float32";
  v[5].name.clear();
  v[5].error = "stalled: tensor 'x' (waiting 301.0 s) is missing on ranks 1, 3";
  v[6].group = "grads.0";
  v[6].group_size = 2;
  return v;
}

// ---- CRC-32 -------------------------------------------------------------------------------------

uint32_t BitwiseCrc32(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1u) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

TEST(Crc32Test, KnownValues) {
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(nullptr, 0), 0u);
  EXPECT_EQ(Crc32("a", 1), 0xE8B7BE43u);
}

TEST(Crc32Test, MatchesBitwiseReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(300);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n + offset <= 200; ++n) {
      ASSERT_EQ(Crc32(buf.data() + offset, n), BitwiseCrc32(buf.data() + offset, n))
          << "offset " << offset << " length " << n;
    }
  }
}

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
      MakeRequest(std::string("nul\0inside", 10), {std::numeric_limits<int64_t>::max(), 0});
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

// ---- Rejection: framing -------------------------------------------------------------------------

TEST(WireFormatTest, EveryTruncationIsRejected) {
  const std::string req = SerializeRequestList({SomeRequests()});
  for (size_t n = 0; n < req.size(); ++n) {
    ASSERT_TRUE(IsCorrupt(ParseReq(req.substr(0, n)))) << "request prefix " << n;
  }
  const std::string resp = SerializeResponseList({SomeResponses()});
  for (size_t n = 0; n < resp.size(); ++n) {
    ASSERT_TRUE(IsCorrupt(ParseResp(resp.substr(0, n)))) << "response prefix " << n;
  }
}

// Same, but with the header rewritten to fit each prefix: the field reads themselves must notice.
TEST(WireFormatTest, EveryTruncatedPayloadWithAValidHeaderIsRejected) {
  const std::string req = HandRequestPayload(SomeRequests()).str();
  for (size_t n = 0; n < req.size(); ++n) {
    ASSERT_TRUE(IsCorrupt(ParseReq(Frame(kRequestKind, req.substr(0, n))))) << n;
  }
  const std::string resp = HandResponsePayload(SomeResponses()).str();
  for (size_t n = 0; n < resp.size(); ++n) {
    ASSERT_TRUE(IsCorrupt(ParseResp(Frame(kResponseKind, resp.substr(0, n))))) << n;
  }
}

TEST(WireFormatTest, TruncationMessageNamesByteAndField) {
  // The cut falls in the second entry, behind a long first one, so the entry count check passes
  // and the field reads themselves must report it.
  const Request second = MakeRequest("abc", {5, 6});
  const Bytes one = HandRequestPayload({second});  // offsets within an entry like the second
  const Bytes b = HandRequestPayload({MakeRequest(std::string(200, 'x')), second});
  const size_t entry1 = b.size() - (one.size() - 4);
  const size_t prescale = entry1 + one.At("reduce op") + 1 - 4;
  const Status s = ParseReq(Frame(kRequestKind, b.str().substr(0, prescale + 3)));
  EXPECT_TRUE(IsCorrupt(s, "request list entry 1: truncated at byte " +
                               std::to_string(kWireHeaderBytes + prescale) +
                               " reading prescale (needs 8 bytes, 3 remain)"));
  // A cut inside the dimensions is caught earlier, by the dimension count.
  const size_t ndims = entry1 + one.At("ndims") - 4;
  const Status dims = ParseReq(Frame(kRequestKind, b.str().substr(0, ndims + 4 + 11)));
  EXPECT_TRUE(IsCorrupt(dims, "request list entry 1: shape ndims 2 at byte " +
                                  std::to_string(kWireHeaderBytes + ndims) +
                                  " needs at least 16 bytes but only 11 remain"));
}

TEST(WireFormatTest, EverySingleByteChangeIsRejected) {
  const std::string req = SerializeRequestList({SomeRequests()});
  const std::string resp = SerializeResponseList({SomeResponses()});
  for (const std::string* valid : {&req, &resp}) {
    for (size_t i = 0; i < valid->size(); ++i) {
      for (int x = 1; x < 256; ++x) {
        std::string bad = *valid;
        bad[i] = static_cast<char>(bad[i] ^ x);
        const Status s = valid == &req ? ParseReq(bad) : ParseResp(bad);
        ASSERT_TRUE(IsCorrupt(s)) << "byte " << i << " xor " << x;
      }
    }
  }
}

TEST(WireFormatTest, WrongKindIsRejected) {
  EXPECT_TRUE(IsCorrupt(ParseResp(SerializeRequestList({SomeRequests()})),
                        "message kind 1 (request list) where a response list was expected"));
  EXPECT_TRUE(IsCorrupt(ParseReq(SerializeResponseList({SomeResponses()})), "message kind 2"));
  EXPECT_TRUE(IsCorrupt(ParseReq(Frame(3, HandRequestPayload({}).str())), "kind 3 (unknown)"));
}

TEST(WireFormatTest, HeaderFieldsAreChecked) {
  const std::string valid = SerializeRequestList({SomeRequests()});
  ASSERT_TRUE(ParseReq(valid).ok());
  EXPECT_TRUE(IsCorrupt(ParseReq(Patched(valid, 0, 0x4E595348, 4)), "bad magic"));
  EXPECT_TRUE(IsCorrupt(ParseReq(Patched(valid, 4, 1, 2)), "unsupported version 1"));
  EXPECT_TRUE(IsCorrupt(ParseReq(Patched(valid, 4, 3, 2)), "unsupported version 3"));
  EXPECT_TRUE(IsCorrupt(ParseReq(valid + "x"), "header says the payload is"));
  EXPECT_TRUE(IsCorrupt(ParseReq(Patched(valid, 8, valid.size(), 4)), "header says the payload"));
  EXPECT_TRUE(IsCorrupt(ParseReq(Patched(valid, 12, 0, 4)), "CRC mismatch"));
  EXPECT_TRUE(IsCorrupt(ParseReq(valid.substr(0, 5)), "shorter than the 16-byte header"));
}

TEST(WireFormatTest, NullAndEmptyInputsAreRejected) {
  RequestList out;
  EXPECT_TRUE(IsCorrupt(ParseRequestList(nullptr, 0, &out), "0 bytes"));
  EXPECT_TRUE(IsCorrupt(ParseRequestList(nullptr, 64, &out), "null data"));
  const std::string valid = SerializeRequestList({});
  EXPECT_EQ(ParseRequestList(valid.data(), valid.size(), nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseResponseList(valid.data(), valid.size(), nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST(WireFormatTest, FailedParseLeavesOutputUntouched) {
  RequestList out{{MakeRequest("keep")}};
  std::string bad = HandRequestPayload({MakeRequest("a"), MakeRequest("b")}).str();
  bad.pop_back();
  ASSERT_FALSE(ParseReq(Frame(kRequestKind, bad), &out).ok());
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].name, "keep");
}

// ---- Rejection: fields, with a valid CRC so only field validation can catch them ----------------

TEST(WireFormatTest, HandBuiltPayloadsParse) {
  // The positive controls for the tests below.
  ASSERT_TRUE(ParseReq(Frame(kRequestKind, HandRequestPayload({MakeRequest("a")}).str())).ok());
  ASSERT_TRUE(ParseResp(Frame(kResponseKind, HandResponsePayload(SomeResponses()).str())).ok());
}

TEST(WireFormatTest, BadRequestEnumsAreRejected) {
  const Bytes b = HandRequestPayload({MakeRequest("a")});
  auto parse = [&](const std::string& field, uint64_t value) {
    return ParseReq(Frame(kRequestKind, Patched(b.str(), b.At(field), value, 1)));
  };
  EXPECT_TRUE(IsCorrupt(parse("op", kNumOpTypes),
                        "invalid op value " + std::to_string(kNumOpTypes) + " at byte"));
  EXPECT_TRUE(IsCorrupt(parse("op", 255), "invalid op value 255"));
  EXPECT_TRUE(IsCorrupt(parse("dtype", kNumDataTypes), "invalid dtype value 8"));
  EXPECT_TRUE(IsCorrupt(parse("device kind", 2), "invalid device kind value 2"));
  EXPECT_TRUE(IsCorrupt(parse("reduce op", kNumReduceOps), "invalid reduce op value 5"));
  EXPECT_TRUE(parse("op", kNumOpTypes - 1).ok());
  EXPECT_TRUE(parse("dtype", kNumDataTypes - 1).ok());
  EXPECT_TRUE(parse("device kind", 1).ok());
  EXPECT_TRUE(parse("reduce op", kNumReduceOps - 1).ok());
}

TEST(WireFormatTest, BadResponseEnumsAreRejected) {
  const Bytes b = HandResponsePayload({MakeResponse("a")});
  auto parse = [&](const std::string& field, uint64_t value) {
    return ParseResp(Frame(kResponseKind, Patched(b.str(), b.At(field), value, 1)));
  };
  EXPECT_TRUE(IsCorrupt(parse("type", kNumResponseTypes),
                        "invalid response type value " + std::to_string(kNumResponseTypes)));
  EXPECT_TRUE(IsCorrupt(parse("dtype", 200), "invalid dtype value 200"));
  EXPECT_TRUE(IsCorrupt(parse("device kind", 9), "invalid device kind value 9"));
  EXPECT_TRUE(IsCorrupt(parse("reduce op", 77), "invalid reduce op value 77"));
  EXPECT_TRUE(parse("type", kNumResponseTypes - 1).ok());
}

TEST(WireFormatTest, NegativeDimsAreRejected) {
  const Bytes req = HandRequestPayload({MakeRequest("a", {3, 4})});
  EXPECT_TRUE(IsCorrupt(ParseReq(Frame(kRequestKind, Patched(req.str(), req.At("dim0"),
                                                             static_cast<uint64_t>(-1), 8))),
                        "negative shape dim -1 at byte"));

  Response p = MakeResponse("g", ResponseType::kAllgather);
  p.first_dims = {2, 2};
  const Bytes resp = HandResponsePayload({p});
  EXPECT_TRUE(IsCorrupt(
      ParseResp(Frame(kResponseKind, Patched(resp.str(), resp.At("dim0"), 1ull << 63, 8))),
      "negative shape dim"));
  EXPECT_TRUE(IsCorrupt(ParseResp(Frame(kResponseKind, Patched(resp.str(), resp.At("first_dim0"),
                                                               static_cast<uint64_t>(-5), 8))),
                        "negative first dim -5"));
}

TEST(WireFormatTest, OversizedCountsAreRejected) {
  const Bytes req = HandRequestPayload({MakeRequest("abc", {3})});
  auto parse_req = [&](const std::string& field, uint64_t value) {
    return ParseReq(Frame(kRequestKind, Patched(req.str(), req.At(field), value, 4)));
  };
  EXPECT_TRUE(
      IsCorrupt(parse_req("count", kMaxWireEntries + 1), "entry count 16777217 at byte 16"));
  EXPECT_TRUE(
      IsCorrupt(parse_req("count", 2), "entry count 2 at byte 16 needs at least 112 bytes"));
  EXPECT_TRUE(IsCorrupt(parse_req("count", 0xFFFFFFFFu), "over the limit"));
  EXPECT_TRUE(
      IsCorrupt(parse_req("name length", kMaxWireNameBytes + 1), "over the limit of 65536"));
  EXPECT_TRUE(IsCorrupt(parse_req("name length", 1000), "name length 1000"));
  EXPECT_TRUE(IsCorrupt(parse_req("ndims", kMaxWireDims + 1), "shape ndims 65"));
  EXPECT_TRUE(IsCorrupt(parse_req("ndims", 40), "shape ndims 40"));

  Response p = MakeResponse("g", ResponseType::kAllgather);
  p.first_dims = {1};
  p.error = "e";
  const Bytes resp = HandResponsePayload({p});
  auto parse_resp = [&](const std::string& field, uint64_t value) {
    return ParseResp(Frame(kResponseKind, Patched(resp.str(), resp.At(field), value, 4)));
  };
  EXPECT_TRUE(IsCorrupt(parse_resp("count", 1u << 30), "entry count"));
  EXPECT_TRUE(IsCorrupt(parse_resp("first_dims count", kMaxWireEntries + 1), "first_dims count"));
  EXPECT_TRUE(IsCorrupt(parse_resp("first_dims count", 3), "first_dims count 3"));
  EXPECT_TRUE(IsCorrupt(parse_resp("error length", kMaxWireErrorBytes + 1), "error length"));
  EXPECT_TRUE(IsCorrupt(parse_resp("error length", 10), "error length 10"));
  EXPECT_TRUE(IsCorrupt(parse_resp("group length", 5), "group length 5"));
  EXPECT_TRUE(IsCorrupt(parse_req("group length", kMaxWireNameBytes + 1), "over the limit"));
  EXPECT_TRUE(
      IsCorrupt(parse_req("group size", static_cast<uint32_t>(-2)), "negative group size -2"));
  EXPECT_TRUE(
      IsCorrupt(parse_resp("group size", static_cast<uint32_t>(-1)), "negative group size -1"));
}

TEST(WireFormatTest, TrailingBytesAreRejected) {
  const std::string req = HandRequestPayload({MakeRequest("a")}).str();
  EXPECT_TRUE(
      IsCorrupt(ParseReq(Frame(kRequestKind, req + std::string(1, '\0'))), "1 trailing bytes"));
  const std::string resp = HandResponsePayload({}).str();
  EXPECT_TRUE(IsCorrupt(ParseResp(Frame(kResponseKind, resp + "zz")), "2 trailing bytes"));
}

// Random damage behind a valid CRC reaches the field checks. Whatever is accepted must be a message
// the serializer would have written byte for byte: the format has one encoding per value.
TEST(WireFormatTest, RandomlyDamagedPayloadsAreRejectedOrCanonical) {
  std::mt19937 rng(1234);
  const std::string req = HandRequestPayload(SomeRequests()).str();
  const std::string resp = HandResponsePayload(SomeResponses()).str();
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const bool is_req = iter % 2 == 0;
    std::string payload = is_req ? req : resp;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % payload.size();
      switch (rng() % 4) {
        case 0:
          payload[at] = static_cast<char>(rng());
          break;
        case 1:
          payload[at] = static_cast<char>(rng() % 8);
          break;  // small counts and enums
        case 2:
          payload.erase(at, 1 + rng() % 8);
          break;
        default:
          payload.insert(at, 1 + rng() % 8, static_cast<char>(rng()));
          break;
      }
      if (payload.empty()) payload = "x";
    }
    const std::string bytes = Frame(is_req ? kRequestKind : kResponseKind, payload);
    if (is_req) {
      RequestList out;
      if (ParseReq(bytes, &out).ok()) {
        ++accepted;
        ASSERT_EQ(SerializeRequestList(out), bytes) << iter;
      }
    } else {
      ResponseList out;
      if (ParseResp(bytes, &out).ok()) {
        ++accepted;
        ASSERT_EQ(SerializeResponseList(out), bytes) << iter;
      }
    }
  }
  EXPECT_GT(accepted, 0);  // some edits only change values, which must still parse
}

// ---- Serializer preconditions -------------------------------------------------------------------

TEST(WireFormatDeathTest, UnserializableRequestsAbort) {
  EXPECT_DEATH(SerializeRequestList({{MakeRequest(std::string(kMaxWireNameBytes + 1, 'n'))}}),
               "name is 65537 bytes");
  EXPECT_DEATH(SerializeRequestList({{MakeRequest("d", std::vector<int64_t>(kMaxWireDims + 1))}}),
               "65 dimensions");
  EXPECT_DEATH(SerializeRequestList({{MakeRequest("n", {2, -1})}}), "negative dimension -1");
}

// ---- Message helpers ----------------------------------------------------------------------------

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

  std::vector<Request> misses(9, q);
  misses[0].name = "b";
  misses[1].op = OpType::kBroadcast;
  misses[2].dtype = DataType::kFloat32;
  misses[3].shape = {4, 3, 1};
  misses[4].device = Device::Cuda(0);
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
