#include "gradient_set.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

namespace gradsync_bench {

int64_t TensorSpec::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // shapes are validated against overflow when parsed
  return n;
}

int64_t TensorSpec::num_bytes() const {
  return num_elements() * static_cast<int64_t>(gradsync::DataTypeSize(dtype));
}

int64_t GradientSet::num_bytes() const {
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += t.num_bytes();
  return total;
}

namespace {

// Thrown inside the parser and rethrown with the file and line in front.
struct LineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool ParseInt64(const std::string& text, int64_t* out) {
  if (text.empty() || text[0] == '-' || text[0] == '+') return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

gradsync::DataType ParseDataType(const std::string& text) {
  for (int i = 0; i < gradsync::kNumDataTypes; ++i) {
    auto dtype = static_cast<gradsync::DataType>(i);
    if (gradsync::DataTypeName(dtype) == text) return dtype;
  }
  throw LineError("unknown dtype '" + text + "'");
}

// "AxBxC" with every dimension >= 1 and a product (in bytes too) that fits int64.
std::vector<int64_t> ParseShape(const std::string& text, size_t element_size) {
  std::vector<int64_t> shape;
  int64_t product = static_cast<int64_t>(element_size);
  std::istringstream dims(text);
  std::string dim;
  while (std::getline(dims, dim, 'x')) {
    int64_t d = 0;
    if (!ParseInt64(dim, &d) || d < 1)
      throw LineError("bad dimension '" + dim + "' in shape '" + text + "'");
    if (product > std::numeric_limits<int64_t>::max() / d)
      throw LineError("shape '" + text + "' is too large");
    product *= d;
    shape.push_back(d);
  }
  if (shape.empty() || text.back() == 'x') throw LineError("bad shape '" + text + "'");
  return shape;
}

TensorSpec ParseLine(const std::string& line, size_t expected_index) {
  std::istringstream fields(line);
  std::string index, name, dtype, shape, extra;
  if (!(fields >> index >> name >> dtype >> shape)) {
    throw LineError("expected 'index name dtype shape', got '" + line + "'");
  }
  if (fields >> extra) throw LineError("unexpected field '" + extra + "' after the shape");
  int64_t i = 0;
  if (!ParseInt64(index, &i) || static_cast<uint64_t>(i) != expected_index) {
    throw LineError("index '" + index + "' out of sequence, expected " +
                    std::to_string(expected_index));
  }
  TensorSpec spec;
  spec.name = name;
  spec.dtype = ParseDataType(dtype);
  spec.shape = ParseShape(shape, gradsync::DataTypeSize(spec.dtype));
  return spec;
}

bool IsBlankOrComment(const std::string& line) {
  size_t first = line.find_first_not_of(" \t\r");
  return first == std::string::npos || line[first] == '#';
}

}  // namespace

GradientSet ParseGradientSet(std::istream& in, const std::string& source, const std::string& name) {
  GradientSet set;
  set.name = name;
  std::unordered_set<std::string> seen;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (IsBlankOrComment(line)) continue;
    try {
      TensorSpec spec = ParseLine(line, set.tensors.size());
      if (!seen.insert(spec.name).second)
        throw LineError("duplicate tensor name '" + spec.name + "'");
      set.tensors.push_back(std::move(spec));
    } catch (const LineError& e) {
      throw std::runtime_error(source + ":" + std::to_string(line_no) + ": " + e.what());
    }
  }
  if (in.bad()) throw std::runtime_error(source + ": read error");
  if (set.tensors.empty()) throw std::runtime_error(source + ": no tensors");
  return set;
}

GradientSet LoadGradientSet(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::string stem = path.substr(path.find_last_of('/') + 1);
  stem = stem.substr(0, stem.find_last_of('.'));
  return ParseGradientSet(in, path, stem);
}

}  // namespace gradsync_bench
