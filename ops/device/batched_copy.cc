#include "ops/device/batched_copy.h"

namespace gradsync {

std::vector<int64_t> PlanCopyChunks(const CopySegment* segments, int num_segments,
                                    size_t element_size) {
  std::vector<int64_t> first_chunk(static_cast<size_t>(num_segments) + 1);
  const int64_t per_chunk = ChunkElements(element_size);
  int64_t chunks = 0;
  for (int i = 0; i < num_segments; ++i) {
    first_chunk[static_cast<size_t>(i)] = chunks;
    chunks += (segments[i].count + per_chunk - 1) / per_chunk;
  }
  first_chunk[static_cast<size_t>(num_segments)] = chunks;
  return first_chunk;
}

Status RunBatchedCopyOnHost(const std::vector<CopySegment>& segments, DataType dtype, int lanes) {
  if (lanes <= 0) return Status::InvalidArgument("a batched copy needs at least one lane");
  const bool known = DispatchStorageType(dtype, [&](auto storage) {
    using T = decltype(storage);
    const int n = static_cast<int>(segments.size());
    const std::vector<int64_t> first_chunk = PlanCopyChunks(segments.data(), n, sizeof(T));
    for (int64_t chunk = 0; chunk < first_chunk.back(); ++chunk) {
      for (int lane = 0; lane < lanes; ++lane) {
        RunCopyChunk<T>(segments.data(), first_chunk.data(), n, chunk, lane, lanes);
      }
    }
  });
  if (!known) return Status::InvalidArgument("a batched copy of an unknown data type");
  return Status::OK();
}

}  // namespace gradsync
