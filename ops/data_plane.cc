#include "ops/data_plane.h"

namespace gradsync {

std::vector<int64_t> EvenSplits(int64_t rows, int parts) {
  if (parts <= 0) return {};
  std::vector<int64_t> splits(static_cast<size_t>(parts), rows / parts);
  for (int64_t r = 0; r < rows % parts; ++r) ++splits[static_cast<size_t>(r)];
  return splits;
}

}  // namespace gradsync
