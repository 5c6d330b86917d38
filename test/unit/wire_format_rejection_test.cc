// What the wire format's parsers reject: every truncation, every single-byte change, bad
// headers, and fields that a valid checksum carries but the format does not allow.
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
  EXPECT_TRUE(IsCorrupt(parse("reduce op", kNumReduceOps), "invalid reduce op value 6"));
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

// Dimensions each valid but whose product overflows (2^32 x 2^32 elements): a peer's message that
// would send every rank's sizing arithmetic past int64. A zero dimension empties the tensor.
TEST(WireFormatTest, ShapesWhoseByteCountOverflowsAreRejected) {
  const Bytes req = HandRequestPayload({MakeRequest("a", {3, 4})});
  std::string big = Patched(req.str(), req.At("dim0"), 1ull << 32, 8);
  big = Patched(big, req.At("dim0") + 8, 1ull << 32, 8);
  EXPECT_TRUE(IsCorrupt(ParseReq(Frame(kRequestKind, big)), "byte count overflows int64"));
  std::string empty = Patched(req.str(), req.At("dim0"), 1ull << 61, 8);
  empty = Patched(empty, req.At("dim0") + 8, 0, 8);
  EXPECT_TRUE(ParseReq(Frame(kRequestKind, empty)).ok());

  const Bytes resp = HandResponsePayload({MakeResponse("r", ResponseType::kAllreduce)});
  EXPECT_TRUE(IsCorrupt(
      ParseResp(Frame(kResponseKind, Patched(resp.str(), resp.At("dim0"), 1ull << 62, 8))),
      "byte count overflows int64"));
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

}  // namespace
}  // namespace gradsync
