// A stand-in for libFuzzer's driver, linked into the *_fuzzer targets when the build has no
// libFuzzer (GRADSYNC_FUZZ off, any compiler): it runs LLVMFuzzerTestOneInput over every file
// named on the command line or found in a named directory, and over a fixed set of mutations of
// each (every prefix, then random bit flips, cuts, overwritten length and count fields, inserted
// and erased bytes). The mutations are derived from the file's bytes alone, so every run checks the
// same inputs and a failure reproduces. Without them the suite would feed the parsers well-formed
// messages only.
//
//   request_list_fuzzer [--mutations=N] PATH...
//
// Exits 0 when every input passed; a failed check aborts inside the target.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "coordinator/crc32.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

constexpr long kDefaultMutationsPerFile = 5000;

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

void PutLe(std::string* s, size_t at, uint64_t value, size_t width) {
  for (size_t i = 0; i < width && at + i < s->size(); ++i) {
    (*s)[at + i] = static_cast<char>(value >> (8 * i));
  }
}

// Values that sit on the parser's limits or overflow a size computation when read as a count,
// length or dimension.
constexpr uint64_t kEdgeValues[] = {
    0,         1,         2,         7,          8,          63,         64,        65,
    255,       0x7FFF,    0xFFFF,    0x10000,    0x10001,    0x100000,   0x100001,  0xFFFFFF,
    0x1000000, 0x1000001, 0x7FFFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF};

// One deterministic mutant of `seed`: one to three edits chosen by `rng`.
std::string Mutate(const std::string& seed, std::mt19937_64* rng) {
  std::string s = seed;
  const int edits = 1 + static_cast<int>((*rng)() % 3);
  for (int e = 0; e < edits; ++e) {
    const size_t at = s.empty() ? 0 : (*rng)() % s.size();
    switch ((*rng)() % 7) {
      case 0:  // one flipped bit
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1u << ((*rng)() % 8)));
        break;
      case 1:  // a cut anywhere
        s.resize(s.empty() ? 0 : (*rng)() % s.size());
        break;
      case 2:  // a u32 count or length field set to an edge value
        PutLe(&s, at, kEdgeValues[(*rng)() % std::size(kEdgeValues)], 4);
        break;
      case 3:  // the same value off by a little, which lands next to what remains
        PutLe(&s, at, s.size() + (*rng)() % 16 - 8, 4);
        break;
      case 4:  // a small value where an enum or count lives
        if (!s.empty()) s[at] = static_cast<char>((*rng)() % 12);
        break;
      case 5:  // an i64 dimension or f64 scale factor made negative, huge or NaN
        PutLe(&s, at, uint64_t{1} << (52 + (*rng)() % 12) | (*rng)() % 3, 8);
        break;
      default:  // bytes inserted or erased, shifting every field after them
        if ((*rng)() % 2 == 0) {
          s.insert(at, 1 + (*rng)() % 8, static_cast<char>((*rng)()));
        } else if (!s.empty()) {
          s.erase(at, 1 + (*rng)() % 8);
        }
        break;
    }
  }
  return s;
}

bool ReadFile(const fs::path& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

// The files named by `arg`: itself, or a directory's regular files in name order.
bool CollectFiles(const std::string& arg, std::vector<fs::path>* files) {
  std::error_code ec;
  if (fs::is_directory(arg, ec)) {
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(arg, ec)) {
      if (entry.is_regular_file()) found.push_back(entry.path());
    }
    if (ec) return false;
    std::sort(found.begin(), found.end());
    files->insert(files->end(), found.begin(), found.end());
    return true;
  }
  if (!fs::is_regular_file(arg, ec)) return false;
  files->push_back(arg);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = kDefaultMutationsPerFile;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--mutations=", 0) == 0) {
      char* end = nullptr;
      mutations = std::strtol(arg.c_str() + 12, &end, 10);
      if (*end != '\0' || mutations < 0) {
        std::fprintf(stderr, "%s: bad --mutations value '%s'\n", argv[0], arg.c_str() + 12);
        return 2;
      }
    } else if (!CollectFiles(arg, &files)) {
      std::fprintf(stderr, "%s: cannot read '%s'\n", argv[0], arg.c_str());
      return 2;
    }
  }
  // An empty corpus would pass without testing anything; it means the generator did not run.
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s [--mutations=N] FILE_OR_DIR...  (no input files found)\n",
                 argv[0]);
    return 2;
  }

  const auto start = std::chrono::steady_clock::now();
  size_t inputs = 0;
  for (const fs::path& path : files) {
    std::string seed;
    if (!ReadFile(path, &seed)) {
      std::fprintf(stderr, "%s: cannot read '%s'\n", argv[0], path.c_str());
      return 2;
    }
    Run(seed);
    // Every prefix: each cut lands inside a different field.
    for (size_t n = 0; n < seed.size(); ++n) Run(seed.substr(0, n));
    std::mt19937_64 rng(gradsync::Crc32(seed.data(), seed.size()));
    for (long m = 0; m < mutations; ++m) Run(Mutate(seed, &rng));
    inputs += 1 + seed.size() + static_cast<size_t>(mutations);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %zu files, %zu inputs, all passed in %.2f s\n", argv[0], files.size(), inputs,
              seconds);
  return 0;
}
