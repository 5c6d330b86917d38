// Gradient sets: the parameter gradients of a real model, in the order the framework registers
// them, read from the text files described in the shared data folder's README
// (`index name dtype shape` per line, shape as AxBxC, `#` starts a comment line).
//
// Plain values; parsing is a pure function of the file and may run on any thread.
#pragma once

#include <gradsync/types.h>

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace gradsync_bench {

struct TensorSpec {
  std::string name;
  gradsync::DataType dtype = gradsync::DataType::kFloat32;
  std::vector<int64_t> shape;

  int64_t num_elements() const;
  int64_t num_bytes() const;
};

struct GradientSet {
  std::string name;                 // the file's stem, e.g. "resnet50"
  std::vector<TensorSpec> tensors;  // registration order

  int64_t num_bytes() const;
};

// Reads `path`; the set is named after the file. Throws std::runtime_error("path:line: why") for
// a malformed line, an index out of sequence, a duplicate name, an unknown dtype or a bad shape.
GradientSet LoadGradientSet(const std::string& path);

// The same from a stream; `source` names it in error messages.
GradientSet ParseGradientSet(std::istream& in, const std::string& source, const std::string& name);

}  // namespace gradsync_bench
