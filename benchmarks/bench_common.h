// Pieces both benchmarks share: MPI and gradsync start-up, flag parsing, exact test patterns and
// interleaved timing.
//
// Everything here runs on the benchmark's main thread; the timing helpers are collective over the
// communicator they are given.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace gradsync_bench {

// MPI with MPI_THREAD_MULTIPLE (gradsync's background thread calls MPI beside the raw baselines),
// then gradsync on MPI_COMM_WORLD. Throws std::runtime_error if MPI cannot give that thread level.
void StartUp(int* argc, char*** argv);
// gradsync first, then MPI, which this program initialized and therefore finalizes.
void TearDown();
// StartUp, run, TearDown; an exception on any rank aborts the job with the program's name, since a
// rank that stopped alone would leave the others blocked in a collective.
int RunBenchmark(const char* program, int (*run)(int, char**), int argc, char** argv);

// "--flag value" pairs. Throws std::invalid_argument for a flag not in `known` or one without a
// value.
class Flags {
 public:
  Flags(int argc, char** argv, const std::vector<std::string>& known);
  std::string Get(const std::string& flag, const std::string& fallback) const;
  // Throws std::invalid_argument unless the value is an integer >= `min`.
  int64_t GetInt(const std::string& flag, int64_t fallback, int64_t min) const;

 private:
  std::map<std::string, std::string> values_;
};

// Integer-valued float data whose sum over ranks is exact in float32: element i of a buffer
// tagged `salt` on `rank`. ExpectedSum() is the value every rank must hold after a SUM allreduce.
void FillPattern(float* data, int64_t count, int64_t salt, int rank);
float ExpectedSum(int64_t i, int64_t salt, int size);
// Index of the first element that is not ExpectedSum(), or -1.
int64_t FirstMismatch(const float* data, int64_t count, int64_t salt, int size);

// True on every rank iff `ok` is true on every rank, so one failing rank stops all of them.
bool AllRanksOk(bool ok, MPI_Comm comm);

// In-place float SUM over `comm`; throws std::runtime_error if MPI fails or count exceeds int.
void AllreduceFloats(float* data, int64_t count, MPI_Comm comm);

struct Strategy {
  std::string name;
  std::function<void()> step;
};

// Runs `warmup` + `iters` rounds; each round times every strategy once, in an order shuffled anew
// each round (the same on every rank: a fixed seed), so every strategy follows every other equally
// often. A step can leave work behind that slows the next one (a nonblocking collective's
// progress, a background thread finishing up); with a fixed cyclic order one strategy would pay
// for the same neighbour every round. A step's time is the slowest rank's, measured from a
// barrier. Returns each strategy's median over the timed rounds, in seconds.
std::vector<double> MeasureInterleaved(const std::vector<Strategy>& strategies, int warmup,
                                       int iters, MPI_Comm comm);

double Median(std::vector<double> values);

}  // namespace gradsync_bench
