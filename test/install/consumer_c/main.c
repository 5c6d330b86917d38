/* Built by a C-only project against the installed package: the include paths and MPI come from
 * gradsync::gradsync, and the program links and runs on two ranks. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int one = 1;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("C consumer: %d ranks: %s\n", size, sum == size ? "ok" : "WRONG");
  MPI_Finalize();
  return sum == size ? 0 : 1;
}
