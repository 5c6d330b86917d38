// Control messages built byte by byte from docs/protocol.md, independently of the library's
// writer, and the parsers' entry points, for the wire format's tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "coordinator/message.h"
#include "coordinator/wire_format.h"
#include "test/unit/message_samples.h"

namespace gradsync {

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
inline std::string Frame(uint16_t kind, const std::string& payload) {
  Bytes h;
  h.U32(kWireMagic);
  h.U16(kWireVersion);
  h.U16(kind);
  h.U32(static_cast<uint32_t>(payload.size()));
  h.U32(Crc32(payload.data(), payload.size()));
  return h.str() + payload;
}

inline Bytes HandRequestPayload(const std::vector<Request>& requests) {
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

inline Bytes HandResponsePayload(const std::vector<Response>& responses) {
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
inline std::string Patched(std::string payload, size_t offset, uint64_t value, int width) {
  for (int i = 0; i < width; ++i)
    payload[offset + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return payload;
}

inline Status ParseReq(const std::string& bytes, RequestList* out = nullptr) {
  RequestList scratch;
  return ParseRequestList(bytes.data(), bytes.size(), out ? out : &scratch);
}

inline Status ParseResp(const std::string& bytes, ResponseList* out = nullptr) {
  ResponseList scratch;
  return ParseResponseList(bytes.data(), bytes.size(), out ? out : &scratch);
}

// Asserts a CorruptMessage whose text contains `needle`.
inline ::testing::AssertionResult IsCorrupt(const Status& s, const std::string& needle = "") {
  if (s.code() != StatusCode::kCorruptMessage) {
    return ::testing::AssertionFailure() << "expected CorruptMessage, got " << s.ToString();
  }
  if (s.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << s.message();
  }
  return ::testing::AssertionSuccess();
}

inline std::vector<Request> SomeRequests() {
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

inline std::vector<Response> SomeResponses() {
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

}  // namespace gradsync
