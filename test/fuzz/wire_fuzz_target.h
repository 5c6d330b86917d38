// The body shared by the wire-format fuzz targets (request_list_fuzzer.cc,
// response_list_fuzzer.cc): what one input is checked for, whichever list kind the target decodes.
//
// Every message carries a CRC-32 of its payload, so nearly every mutated input would stop at the
// CRC check and the payload parser would go unexercised. Each input is therefore parsed twice:
// once exactly as given (the header checks, the CRC check), and once with its 16 header bytes
// rewritten to a valid header for the bytes that follow (the payload parser).
//
// A parse that succeeds must be the one encoding of its value: serializing the result gives back
// the same bytes, and those parse to the same value again, compared bit for bit (NaN scale factors
// included). A parse that fails must return CorruptMessage and leave the output untouched. Any
// other outcome aborts, which libFuzzer and the corpus replay both report as a failure.
//
// Thread safety: stateless; each call works on its own copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coordinator/crc32.h"
#include "coordinator/message.h"
#include "coordinator/wire_format.h"

namespace gradsync {
namespace fuzz {

// Prints why the input is wrong and a hex dump of its start, then aborts so the fuzzer keeps it.
[[noreturn]] inline void FuzzCheckFailed(const char* list_name, const char* what,
                                         const std::string& bytes) {
  std::fprintf(stderr, "%s fuzz check failed: %s\n%zu bytes:", list_name, what, bytes.size());
  for (size_t i = 0; i < bytes.size() && i < 128; ++i) {
    std::fprintf(stderr, "%s%02X", i % 32 == 0 ? "\n  " : " ", static_cast<uint8_t>(bytes[i]));
  }
  std::fprintf(stderr, "%s\n", bytes.size() > 128 ? " ..." : "");
  std::abort();
}

// operator== on doubles calls NaN unequal to itself and -0.0 equal to 0.0; the wire promises to
// keep every bit, so the round trip is checked on the bits.
inline bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

inline bool SameRequest(const Request& a, const Request& b) {
  return a.name == b.name && a.op == b.op && a.dtype == b.dtype && a.shape == b.shape &&
         a.device == b.device && a.reduce_op == b.reduce_op && SameBits(a.prescale, b.prescale) &&
         SameBits(a.postscale, b.postscale) && a.root == b.root && a.rank == b.rank &&
         SameBits(a.waited_seconds, b.waited_seconds) && a.group == b.group &&
         a.group_size == b.group_size;
}

inline bool SameResponse(const Response& a, const Response& b) {
  return a.type == b.type && a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
         a.device == b.device && a.reduce_op == b.reduce_op && SameBits(a.prescale, b.prescale) &&
         SameBits(a.postscale, b.postscale) && a.root == b.root && a.first_dims == b.first_dims &&
         a.error == b.error && a.group == b.group && a.group_size == b.group_size;
}

template <typename Entry, typename Same>
bool SameEntries(const std::vector<Entry>& a, const std::vector<Entry>& b, Same same) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same(a[i], b[i])) return false;
  }
  return true;
}

// What a target needs to know about its list kind.
struct RequestListCodec {
  using List = RequestList;
  static constexpr const char* kName = "request list";
  static constexpr uint16_t kKind = 1;
  static Status Parse(const std::string& b, List* out) {
    return ParseRequestList(b.data(), b.size(), out);
  }
  static std::string Serialize(const List& list) { return SerializeRequestList(list); }
  static bool Same(const List& a, const List& b) {
    return SameEntries(a.requests, b.requests, SameRequest);
  }
  // A value no parse of a rejected message may leave behind: the parser must not touch *out.
  static List Sentinel() {
    Request stale;
    stale.name = "stale.output.must.survive";
    stale.shape = {3, 1};
    return List{{stale}};
  }
};

struct ResponseListCodec {
  using List = ResponseList;
  static constexpr const char* kName = "response list";
  static constexpr uint16_t kKind = 2;
  static Status Parse(const std::string& b, List* out) {
    return ParseResponseList(b.data(), b.size(), out);
  }
  static std::string Serialize(const List& list) { return SerializeResponseList(list); }
  static bool Same(const List& a, const List& b) {
    return SameEntries(a.responses, b.responses, SameResponse);
  }
  static List Sentinel() {
    Response stale;
    stale.name = "stale.output.must.survive";
    stale.first_dims = {4, 2};
    return List{{stale}};
  }
};

template <typename Codec>
void CheckOneParse(const std::string& bytes) {
  typename Codec::List parsed = Codec::Sentinel();
  const Status status = Codec::Parse(bytes, &parsed);
  if (!status.ok()) {
    if (status.code() != StatusCode::kCorruptMessage || status.message().empty()) {
      FuzzCheckFailed(Codec::kName, "rejected without a CorruptMessage explanation", bytes);
    }
    if (!Codec::Same(parsed, Codec::Sentinel())) {
      FuzzCheckFailed(Codec::kName, "a rejected message changed the caller's output", bytes);
    }
    return;
  }
  // The serializer aborts on values no parser may accept, so an abort inside this call means the
  // parser accepted something it should have rejected.
  const std::string again = Codec::Serialize(parsed);
  if (again != bytes) {
    FuzzCheckFailed(Codec::kName, "an accepted message is not the encoding of its own value",
                    bytes);
  }
  typename Codec::List reparsed;
  if (!Codec::Parse(again, &reparsed).ok()) {
    FuzzCheckFailed(Codec::kName, "the re-serialized message does not parse", again);
  }
  if (!Codec::Same(reparsed, parsed)) {
    FuzzCheckFailed(Codec::kName, "the re-serialized message parses to a different value", again);
  }
}

// `bytes` with its first 16 bytes replaced by a valid header of list kind `kind` for the rest.
inline std::string WithValidHeader(const uint8_t* data, size_t size, uint16_t kind) {
  std::string out(reinterpret_cast<const char*>(data), size);
  const size_t payload_bytes = size - kWireHeaderBytes;
  const uint32_t crc = Crc32(data + kWireHeaderBytes, payload_bytes);
  const uint64_t fields[] = {kWireMagic, kWireVersion, kind, payload_bytes, crc};
  const int widths[] = {4, 2, 2, 4, 4};
  size_t at = 0;
  for (int f = 0; f < 5; ++f) {
    for (int i = 0; i < widths[f]; ++i) out[at++] = static_cast<char>(fields[f] >> (8 * i));
  }
  return out;
}

template <typename Codec>
void FuzzOneMessage(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  CheckOneParse<Codec>(raw);
  // Payloads over 4 GiB cannot have a valid header; fuzz inputs never come near that.
  if (size < kWireHeaderBytes || size - kWireHeaderBytes > UINT32_MAX) return;
  const std::string framed = WithValidHeader(data, size, Codec::kKind);
  if (framed != raw) CheckOneParse<Codec>(framed);
}

}  // namespace fuzz
}  // namespace gradsync
