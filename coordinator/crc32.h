// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320): the checksum of negotiation messages.
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradsync {

// Crc32("123456789") == 0xCBF43926.
uint32_t Crc32(const void* data, size_t size);

}  // namespace gradsync
