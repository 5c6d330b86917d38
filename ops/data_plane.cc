#include "ops/data_plane.h"

#include <string>

namespace gradsync {

std::vector<int64_t> EvenSplits(int64_t rows, int parts) {
  if (parts <= 0) return {};
  std::vector<int64_t> splits(static_cast<size_t>(parts), rows / parts);
  for (int64_t r = 0; r < rows % parts; ++r) ++splits[static_cast<size_t>(r)];
  return splits;
}

Status CheckSplits(const std::vector<int64_t>& splits, int64_t rows, int size) {
  if (splits.size() != static_cast<size_t>(size)) {
    return Status::InvalidArgument(std::to_string(splits.size()) + " splits for " +
                                   std::to_string(size) + " ranks; give one per rank");
  }
  int64_t total = 0;
  for (size_t r = 0; r < splits.size(); ++r) {
    if (splits[r] < 0) {
      return Status::InvalidArgument("split for rank " + std::to_string(r) + " is negative (" +
                                     std::to_string(splits[r]) + ")");
    }
    if (splits[r] > rows - total) {
      return Status::InvalidArgument("splits add up to more than the first dimension " +
                                     std::to_string(rows));
    }
    total += splits[r];
  }
  if (total != rows) {
    return Status::InvalidArgument("splits add up to " + std::to_string(total) +
                                   ", not to the first dimension " + std::to_string(rows));
  }
  return Status::OK();
}

std::string DescribeBucket(const std::string& collective, const std::vector<TensorEntry*>& entries,
                           size_t max_named) {
  std::string s = collective + (entries.size() == 1 ? " of tensor " : " of tensors ");
  for (size_t i = 0; i < entries.size() && i < max_named; ++i) {
    s += (i ? ", '" : "'") + entries[i]->name + "'";
  }
  if (entries.size() > max_named) {
    s += " and " + std::to_string(entries.size() - max_named) + " more";
  }
  return s;
}

}  // namespace gradsync
