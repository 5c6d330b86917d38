/* Built by a C-only project against the installed package: the include paths and MPI come from
 * gradsync::gradsync, and the program reduces through gradsync's C API on two ranks. */
#include <gradsync/c_api.h>
#include <mpi.h>
#include <stdio.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int ok = gradsync_init_comm((int)MPI_Comm_c2f(MPI_COMM_WORLD)) == GRADSYNC_OK;
  int rank = 0, size = 0;
  ok = ok && gradsync_rank(&rank) == GRADSYNC_OK && gradsync_size(&size) == GRADSYNC_OK;
  /* Each rank's own values, so that only a real reduction gives the expected average. */
  float grad[3] = {(float)(rank + 1), (float)(2 * (rank + 1)), 3.0f};
  const int64_t shape[1] = {3};
  gradsync_handle* handle = NULL;
  ok = ok &&
       gradsync_allreduce_async("consumer.grad", grad, GRADSYNC_FLOAT32, shape, 1, GRADSYNC_AVERAGE,
                                1.0, 1.0, GRADSYNC_GLOBAL_PROCESS_SET, &handle) == GRADSYNC_OK;
  ok = ok && gradsync_wait(handle) == GRADSYNC_OK;
  gradsync_release(handle);
  const float mean = (float)(size + 1) / 2.0f; /* of 1..size, exact in float for small sizes */
  ok = ok && grad[0] == mean && grad[1] == 2.0f * mean && grad[2] == 3.0f;
  if (!ok) fprintf(stderr, "C consumer: %s\n", gradsync_last_error());
  gradsync_shutdown();
  if (rank == 0) printf("C consumer: %d ranks: %s\n", size, ok ? "ok" : "WRONG");
  MPI_Finalize();
  return ok ? 0 : 1;
}
