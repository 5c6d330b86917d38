// main() of every GPU test: without a CUDA device, exit 77, which ctest reports as skipped
// (SKIP_RETURN_CODE), never as passed. Built with GPU_TEST_MAIN_WITH_MPI, it also holds MPI
// initialized around all the tests, so that each may init() and shutdown() gradsync (MPI cannot be
// initialized twice in one process), and exits with the worst result over the ranks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

#ifdef GPU_TEST_MAIN_WITH_MPI
#include <mpi.h>
#endif

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
#ifdef GPU_TEST_MAIN_WITH_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  int result = RUN_ALL_TESTS();
#ifdef GPU_TEST_MAIN_WITH_MPI
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  result = worst;
  MPI_Finalize();
#endif
  return result;
}
