// How far apart two CPUs are, as the time one cache line takes to go from one to the other and
// back: two threads, pinned one to each CPU, hand a flag back and forth. Two hardware threads of
// one core, which share their caches, take about a hundred nanoseconds or less; cores that share
// no cache below memory, three hundred or more. On a virtual machine the host may move its virtual
// CPUs between such placements while a job runs, and transfers between processes on one machine
// (the namespace hosts of docs/benchmarks.md) follow: the transport table's runs are tagged with
// it.
//
//   gradsync_cpu_pair_round_trip [--cpus A,B] [--round-trips N] [--samples S]
//
// Prints one line: the median round trip over S samples of N round trips each, in nanoseconds,
// and every sample. No MPI: it measures the machine, not gradsync.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
  int cpu_a = 0;
  int cpu_b = 1;
  long round_trips = 200000;
  int samples = 5;
};

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// The flag lives alone on its cache line, so that nothing else moves with it.
struct alignas(64) Flag {
  std::atomic<long> value{0};
};

// Nanoseconds per round trip over `round_trips` of them, or a negative value if a thread could
// not be pinned.
double Sample(const Options& options) {
  Flag flag;
  std::atomic<bool> pinned{true};
  std::thread echo([&] {
    if (!Pin(options.cpu_b)) pinned = false;
    for (long i = 1; i <= options.round_trips; ++i) {
      // Odd values go out, even values come back.
      while (flag.value.load(std::memory_order_acquire) != 2 * i - 1) {
        if (!pinned) return;
      }
      flag.value.store(2 * i, std::memory_order_release);
    }
  });
  if (!Pin(options.cpu_a)) pinned = false;
  const auto start = std::chrono::steady_clock::now();
  for (long i = 1; i <= options.round_trips && pinned; ++i) {
    flag.value.store(2 * i - 1, std::memory_order_release);
    while (flag.value.load(std::memory_order_acquire) != 2 * i && pinned) {
    }
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  echo.join();
  if (!pinned) return -1.0;
  return std::chrono::duration<double, std::nano>(elapsed).count() /
         static_cast<double>(options.round_trips);
}

bool Parse(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return false;
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--cpus") {
      if (std::sscanf(value, "%d,%d", &options->cpu_a, &options->cpu_b) != 2) return false;
    } else if (flag == "--round-trips") {
      options->round_trips = std::atol(value);
    } else if (flag == "--samples") {
      options->samples = std::atoi(value);
    } else {
      return false;
    }
  }
  return options->round_trips > 0 && options->samples > 0 && options->cpu_a >= 0 &&
         options->cpu_b >= 0 && options->cpu_a != options->cpu_b;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!Parse(argc, argv, &options)) {
    std::fprintf(stderr,
                 "usage: gradsync_cpu_pair_round_trip [--cpus A,B] [--round-trips N] "
                 "[--samples S]\n");
    return 2;
  }
  if (std::thread::hardware_concurrency() < 2) {
    std::printf("cpu pair round trip: one CPU, nothing to measure\n");
    return 0;
  }
  std::vector<double> samples;
  for (int s = 0; s < options.samples; ++s) {
    const double ns = Sample(options);
    if (ns < 0) {
      std::printf("cpu pair round trip: cannot pin to CPUs %d and %d\n", options.cpu_a,
                  options.cpu_b);
      return 1;
    }
    samples.push_back(ns);
  }
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  std::string all;
  for (double ns : samples) all += " " + std::to_string(static_cast<long>(ns + 0.5));
  std::printf("cpu pair round trip: CPUs %d,%d median %.0f ns (samples:%s)\n", options.cpu_a,
              options.cpu_b, sorted[sorted.size() / 2], all.c_str());
  return 0;
}
