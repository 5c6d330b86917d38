// libFuzzer target for ParseRequestList: the bytes rank 0 gathers from every other rank. The
// checks applied to each input are described in wire_fuzz_target.h.
#include <cstddef>
#include <cstdint>

#include "test/fuzz/wire_fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gradsync::fuzz::FuzzOneMessage<gradsync::fuzz::RequestListCodec>(data, size);
  return 0;
}
