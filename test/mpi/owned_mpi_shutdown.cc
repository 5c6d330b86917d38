// gradsync owns MPI here (it is not initialized before init()), and rank 0 reaches shutdown() well
// after the others. gradsync's own part of shutdown must not wait for rank 0; the wait that
// remains is MPI_Finalize's barrier over every process, which the early ranks report in the log.
// Prints "shutdown ok" per rank when gradsync's part was quick; CTest checks the output.
#include <gradsync/gradsync.h>

#include <chrono>
#include <cstdio>
#include <thread>

int main() {
  using Clock = std::chrono::steady_clock;
  gradsync::init();
  const int rank = gradsync::rank();
  const int size = gradsync::size();
  int value = 1;
  gradsync::allreduce(gradsync::TensorView(&value, gradsync::DataType::kInt32, {1})).wait();
  if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // Until MPI_Finalize: the shutdown flag, the last cycle, joining the thread.
  const auto start = Clock::now();
  gradsync::shutdown();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // A late rank 0 keeps every early rank in MPI_Finalize for up to 1.5 s, and no longer.
  const bool ok = value == size;
  std::printf("rank %d: shutdown took %.2f s: %s\n", rank, seconds,
              ok && seconds < 3.0 ? "shutdown ok" : "TOO SLOW OR WRONG");
  return ok && seconds < 3.0 ? 0 : 1;
}
