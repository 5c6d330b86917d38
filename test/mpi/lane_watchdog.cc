// A rank that stops calling AllreduceBatch::wait() while the others reduce the batch's last bucket
// on their own threads: the waiting rank must say so after the stall warning time and end the job
// after the stall shutdown time, rather than hang in MPI. CTest checks the output; a hang is the
// test's timeout.
#include <gradsync/gradsync.h>

#include <chrono>
#include <cstdio>
#include <thread>

int main() {
  gradsync::init();
  const int rank = gradsync::rank();
  float values[4] = {1, 2, 3, 4};
  gradsync::AllreduceBatchOptions options;
  options.names = {"watched.a"};
  gradsync::AllreduceBatch batch({gradsync::TensorView(values, gradsync::DataType::kFloat32, {4})},
                                 options);
  for (int step = 0; step < 3; ++step) {
    if (step == 2 && rank == 1) {
      // Gone without a word: no wait(), no join(), still running.
      std::this_thread::sleep_for(std::chrono::seconds(120));
      break;
    }
    batch.start(0, values);
    batch.wait();
  }
  std::printf("rank %d: not stopped\n", rank);
  gradsync::shutdown();
  return 1;
}
