// Byte format of negotiation messages (docs/protocol.md). A peer's bytes are untrusted: parsing
// checks the header, the length, a CRC-32 of the payload, every enum value and every count against
// what remains, and returns CorruptMessage instead of reading out of bounds.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "coordinator/message.h"
#include "gradsync/status.h"

namespace gradsync {

constexpr uint32_t kWireMagic = 0x4E595347;  // "GSYN" little-endian
constexpr uint16_t kWireVersion = 1;
constexpr size_t kWireHeaderBytes = 16;
// Upper bounds a well-formed message never reaches; larger counts are rejected as corrupt.
constexpr uint32_t kMaxWireNameBytes = 1 << 16;
constexpr uint32_t kMaxWireDims = 64;
constexpr uint32_t kMaxWireEntries = 1 << 24;

std::string SerializeRequestList(const RequestList& list);
Status ParseRequestList(const void* data, size_t size, RequestList* out);

std::string SerializeResponseList(const ResponseList& list);
Status ParseResponseList(const void* data, size_t size, ResponseList* out);

uint32_t Crc32(const void* data, size_t size);

}  // namespace gradsync
