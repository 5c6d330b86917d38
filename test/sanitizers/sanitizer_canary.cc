// A program with one deliberate fault of the kind a sanitizer must catch, run on two ranks around
// a real gradsync job (init, an allreduce, shutdown). Sanitized builds run it once per fault and
// pass only when the sanitizer reports it: a suppression file or a setting that hid gradsync's own
// faults along with Open MPI's would make these tests fail.
//   sanitizer_canary leak|heap-overflow|signed-overflow|race
#include <gradsync/gradsync.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// volatile keeps the compiler from proving the faults away.
volatile int g_sink = 0;

void Leak() {
  int* lost = new int[64];
  lost[0] = gradsync::rank();
  g_sink = lost[0];
}

void HeapOverflow() {
  std::vector<int> values(8, 1);
  const volatile size_t past_end = values.size();
  g_sink = values.data()[past_end];
}

void SignedOverflow() {
  volatile int big = INT_MAX;
  g_sink = big + gradsync::size();
}

void Race() {
  int counter = 0;
  auto bump = [&counter] {
    for (int i = 0; i < 1000; ++i) counter = counter + 1;
  };
  std::thread other(bump);
  bump();
  other.join();
  g_sink = counter;
}

}  // namespace

int main(int argc, char** argv) {
  const char* fault = argc > 1 ? argv[1] : "";
  gradsync::init();
  float value = 1.0f;
  gradsync::allreduce(gradsync::TensorView(&value, gradsync::DataType::kFloat32, {1})).wait();
  if (std::strcmp(fault, "leak") == 0) {
    Leak();
  } else if (std::strcmp(fault, "heap-overflow") == 0) {
    HeapOverflow();
  } else if (std::strcmp(fault, "signed-overflow") == 0) {
    SignedOverflow();
  } else if (std::strcmp(fault, "race") == 0) {
    Race();
  } else {
    std::fprintf(stderr, "usage: sanitizer_canary leak|heap-overflow|signed-overflow|race\n");
    return 2;
  }
  gradsync::shutdown();
  return 0;
}
