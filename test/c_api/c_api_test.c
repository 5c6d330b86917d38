/* The C API end to end, compiled as C: every collective, the error codes of bad input, and a
 * mismatch that fails on every rank and is followed by working collectives. Run under mpirun at 2
 * and 4 ranks (and 1). Exit status: 0 when every check passed on every rank. */
#include <gradsync/c_api.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank = 0;
static int size = 1;
static int failures = 0;

#define CHECK(cond)                                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      ++failures;                                                                            \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s (last error: %s)\n", rank, __FILE__, \
              __LINE__, #cond, gradsync_last_error());                                       \
    }                                                                                        \
  } while (0)

/* The call must fail with `code` and leave a message that contains `needle`. */
#define CHECK_FAILS(call, code, needle)                     \
  do {                                                      \
    int rc_ = (call);                                       \
    CHECK(rc_ == (code));                                   \
    CHECK(strstr(gradsync_last_error(), (needle)) != NULL); \
  } while (0)

static void Allreduces(void) {
  float f[100];
  int32_t n[7];
  double d[3];
  int64_t f_shape[2] = {10, 10}, n_shape[1] = {7}, d_shape[1] = {3};
  for (int i = 0; i < 100; ++i) f[i] = (float)(rank + 1);
  for (int i = 0; i < 7; ++i) n[i] = 2 * rank;
  for (int i = 0; i < 3; ++i) d[i] = rank * 1.5;
  gradsync_handle *hf = NULL, *hn = NULL, *hd = NULL;
  CHECK(gradsync_allreduce_async("c.f", f, GRADSYNC_FLOAT32, f_shape, 2, GRADSYNC_SUM, 2.0, 0.5,
                                 GRADSYNC_GLOBAL_PROCESS_SET, &hf) == GRADSYNC_OK);
  CHECK(gradsync_allreduce_async("c.n", n, GRADSYNC_INT32, n_shape, 1, GRADSYNC_AVERAGE, 1.0, 1.0,
                                 GRADSYNC_GLOBAL_PROCESS_SET, &hn) == GRADSYNC_OK);
  CHECK(gradsync_allreduce_async(NULL, d, GRADSYNC_FLOAT64, d_shape, 1, GRADSYNC_MAX, 1.0, 1.0,
                                 GRADSYNC_GLOBAL_PROCESS_SET, &hd) == GRADSYNC_OK);
  CHECK(gradsync_wait(hf) == GRADSYNC_OK);
  CHECK(gradsync_wait(hn) == GRADSYNC_OK);
  CHECK(gradsync_wait(hd) == GRADSYNC_OK);
  int done = 0;
  CHECK(gradsync_poll(hf, &done) == GRADSYNC_OK && done == 1);
  CHECK(f[99] == (float)(size * (size + 1) / 2));
  CHECK(n[6] == size - 1); /* the mean of 0, 2, ..., 2(size-1) */
  CHECK(d[2] == (size - 1) * 1.5);
  CHECK(gradsync_release(hf) == GRADSYNC_OK);
  CHECK(gradsync_release(hn) == GRADSYNC_OK);
  CHECK(gradsync_release(hd) == GRADSYNC_OK);
}

static void GathersAndScatters(void) {
  /* Allgather: rank r gives r + 1 rows of 2. */
  int32_t mine[2 * 4];
  int64_t shape[2] = {rank + 1, 2};
  for (int i = 0; i < 2 * (rank + 1); ++i) mine[i] = rank;
  gradsync_handle* h = NULL;
  CHECK(gradsync_allgather_async("c.gather", mine, GRADSYNC_INT32, shape, 2,
                                 GRADSYNC_GLOBAL_PROCESS_SET, &h) == GRADSYNC_OK);
  CHECK(gradsync_wait(h) == GRADSYNC_OK);
  const void* out = NULL;
  const int64_t* out_shape = NULL;
  int ndim = 0, dtype = -1;
  CHECK(gradsync_output(h, &out, &dtype, &out_shape, &ndim) == GRADSYNC_OK);
  CHECK(ndim == 2 && out_shape[0] == size * (size + 1) / 2 && out_shape[1] == 2);
  CHECK(dtype == GRADSYNC_INT32);
  if (out != NULL) {
    const int32_t* rows = (const int32_t*)out;
    int at = 0;
    for (int r = 0; r < size; ++r) {
      for (int i = 0; i < 2 * (r + 1); ++i) CHECK(rows[at++] == r);
    }
  }
  gradsync_release(h);

  /* Broadcast from the last rank. */
  double value[4];
  int64_t vshape[1] = {4};
  for (int i = 0; i < 4; ++i) value[i] = rank == size - 1 ? 42.0 : -1.0;
  CHECK(gradsync_broadcast_async("c.bcast", value, GRADSYNC_FLOAT64, vshape, 1, size - 1,
                                 GRADSYNC_GLOBAL_PROCESS_SET, &h) == GRADSYNC_OK);
  CHECK(gradsync_wait(h) == GRADSYNC_OK);
  CHECK(value[3] == 42.0);
  gradsync_release(h);

  /* Alltoall: rank r sends q + 1 rows to rank q. */
  int64_t splits[4];
  int64_t rows = 0;
  for (int q = 0; q < size; ++q) rows += splits[q] = q + 1;
  int64_t sent[10];
  for (int i = 0; i < rows; ++i) sent[i] = 100 * rank + i;
  int64_t sshape[1] = {rows};
  CHECK(gradsync_alltoall_async("c.a2a", sent, GRADSYNC_INT64, sshape, 1, splits, size,
                                GRADSYNC_GLOBAL_PROCESS_SET, &h) == GRADSYNC_OK);
  CHECK(gradsync_wait(h) == GRADSYNC_OK);
  const int64_t* received = NULL;
  int count = 0;
  CHECK(gradsync_received_splits(h, &received, &count) == GRADSYNC_OK);
  CHECK(count == size);
  for (int q = 0; q < count; ++q) CHECK(received[q] == rank + 1);
  CHECK(gradsync_output(h, &out, &dtype, &out_shape, &ndim) == GRADSYNC_OK);
  CHECK(ndim == 1 && out_shape[0] == size * (rank + 1));
  gradsync_release(h);

  /* Reducescatter: 2 * size + 1 rows, lower ranks take the remainder. */
  float all[9];
  int64_t ashape[1] = {2 * size + 1};
  for (int i = 0; i < 2 * size + 1; ++i) all[i] = 1.0f;
  CHECK(gradsync_reducescatter_async("c.rs", all, GRADSYNC_FLOAT32, ashape, 1, GRADSYNC_SUM, 1.0,
                                     1.0, GRADSYNC_GLOBAL_PROCESS_SET, &h) == GRADSYNC_OK);
  CHECK(gradsync_wait(h) == GRADSYNC_OK);
  CHECK(gradsync_output(h, &out, &dtype, &out_shape, &ndim) == GRADSYNC_OK);
  CHECK(ndim == 1 && out_shape[0] == (rank == 0 ? 3 : 2));
  if (out != NULL) CHECK(((const float*)out)[0] == (float)size);
  gradsync_release(h);
}

static void Grouped(void) {
  float a[5], b[3];
  for (int i = 0; i < 5; ++i) a[i] = 1.0f;
  for (int i = 0; i < 3; ++i) b[i] = 2.0f;
  void* data[2] = {a, b};
  const int dtypes[2] = {GRADSYNC_FLOAT32, GRADSYNC_FLOAT32};
  const int64_t sa[1] = {5}, sb[1] = {3};
  const int64_t* shapes[2] = {sa, sb};
  const int ndims[2] = {1, 1};
  const char* names[2] = {"c.group.a", "c.group.b"};
  gradsync_handle* handles[2] = {NULL, NULL};
  CHECK(gradsync_grouped_allreduce_async(2, names, data, dtypes, shapes, ndims, GRADSYNC_SUM, 1.0,
                                         1.0, GRADSYNC_GLOBAL_PROCESS_SET, handles) == GRADSYNC_OK);
  for (int i = 0; i < 2; ++i) CHECK(gradsync_wait(handles[i]) == GRADSYNC_OK);
  CHECK(a[4] == (float)size && b[2] == 2.0f * size);
  for (int i = 0; i < 2; ++i) gradsync_release(handles[i]);

  const void* cdata[2] = {a, b};
  CHECK(gradsync_grouped_allgather_async(2, NULL, cdata, dtypes, shapes, ndims,
                                         GRADSYNC_GLOBAL_PROCESS_SET, handles) == GRADSYNC_OK);
  for (int i = 0; i < 2; ++i) {
    CHECK(gradsync_wait(handles[i]) == GRADSYNC_OK);
    const int64_t* shape = NULL;
    int ndim = 0;
    CHECK(gradsync_output(handles[i], NULL, NULL, &shape, &ndim) == GRADSYNC_OK);
    CHECK(ndim == 1 && shape[0] == (i == 0 ? 5 : 3) * size);
    gradsync_release(handles[i]);
  }
  CHECK(gradsync_grouped_reducescatter_async(2, NULL, cdata, dtypes, shapes, ndims, GRADSYNC_SUM,
                                             1.0, 1.0, GRADSYNC_GLOBAL_PROCESS_SET,
                                             handles) == GRADSYNC_OK);
  for (int i = 0; i < 2; ++i) {
    CHECK(gradsync_wait(handles[i]) == GRADSYNC_OK);
    gradsync_release(handles[i]);
  }
}

static void BadInput(void) {
  float x[4] = {0};
  int64_t shape[1] = {4};
  gradsync_handle* h = NULL;
  CHECK_FAILS(
      gradsync_allreduce_async("bad", x, GRADSYNC_FLOAT32, shape, 1, GRADSYNC_SUM, 1, 1, 0, NULL),
      GRADSYNC_ERROR_INVALID_ARGUMENT, "handle is NULL");
  CHECK_FAILS(gradsync_allreduce_async("bad", x, 99, shape, 1, GRADSYNC_SUM, 1, 1, 0, &h),
              GRADSYNC_ERROR_INVALID_ARGUMENT, "unknown dtype 99");
  CHECK_FAILS(gradsync_allreduce_async("bad", x, GRADSYNC_FLOAT32, shape, 1, 42, 1, 1, 0, &h),
              GRADSYNC_ERROR_INVALID_ARGUMENT, "unknown reduce op 42");
  CHECK_FAILS(
      gradsync_allreduce_async("bad", x, GRADSYNC_FLOAT32, shape, -1, GRADSYNC_SUM, 1, 1, 0, &h),
      GRADSYNC_ERROR_INVALID_ARGUMENT, "ndim -1");
  CHECK_FAILS(
      gradsync_allreduce_async("bad", x, GRADSYNC_FLOAT32, NULL, 1, GRADSYNC_SUM, 1, 1, 0, &h),
      GRADSYNC_ERROR_INVALID_ARGUMENT, "shape is NULL");
  CHECK_FAILS(
      gradsync_allreduce_async("bad", NULL, GRADSYNC_FLOAT32, shape, 1, GRADSYNC_SUM, 1, 1, 0, &h),
      GRADSYNC_ERROR_INVALID_ARGUMENT, "data is null");
  int64_t negative[1] = {-3};
  CHECK_FAILS(
      gradsync_allreduce_async("bad", x, GRADSYNC_FLOAT32, negative, 1, GRADSYNC_SUM, 1, 1, 0, &h),
      GRADSYNC_ERROR_INVALID_ARGUMENT, "negative dimension");
  CHECK_FAILS(
      gradsync_allreduce_async("bad", x, GRADSYNC_FLOAT32, shape, 1, GRADSYNC_SUM, 1, 1, -2, &h),
      GRADSYNC_ERROR_INVALID_ARGUMENT, "negative process set");
  CHECK_FAILS(gradsync_broadcast_async("bad", x, GRADSYNC_FLOAT32, shape, 1, size, 0, &h),
              GRADSYNC_ERROR_INVALID_ARGUMENT, "root rank");
  int64_t splits[1] = {4};
  CHECK_FAILS(gradsync_alltoall_async("bad", x, GRADSYNC_FLOAT32, shape, 1, splits, -1, 0, &h),
              GRADSYNC_ERROR_INVALID_ARGUMENT, "negative nsplits");
  CHECK_FAILS(gradsync_grouped_allreduce_async(-1, NULL, NULL, NULL, NULL, NULL, GRADSYNC_SUM, 1, 1,
                                               0, NULL),
              GRADSYNC_ERROR_INVALID_ARGUMENT, "negative count");
  CHECK_FAILS(gradsync_poll(NULL, NULL), GRADSYNC_ERROR_INVALID_ARGUMENT, "handle is NULL");
  CHECK_FAILS(gradsync_wait(NULL), GRADSYNC_ERROR_INVALID_ARGUMENT, "handle is NULL");
  CHECK_FAILS(gradsync_rank(NULL), GRADSYNC_ERROR_INVALID_ARGUMENT, "NULL");
  CHECK_FAILS(gradsync_add_process_set(NULL, 2, NULL), GRADSYNC_ERROR_INVALID_ARGUMENT,
              "ranks is NULL");
  CHECK(gradsync_release(NULL) == GRADSYNC_OK);
  CHECK(h == NULL);
}

/* Rank 0 gives a different shape: every rank's handle fails with a mismatch naming the tensor,
 * and the next collective works. */
static void MismatchThenWorking(void) {
  float x[5] = {1, 1, 1, 1, 1};
  int64_t shape[1] = {rank == 0 ? 4 : 5};
  gradsync_handle* h = NULL;
  CHECK(gradsync_allreduce_async("c.mismatch", x, GRADSYNC_FLOAT32, shape, 1, GRADSYNC_SUM, 1, 1, 0,
                                 &h) == GRADSYNC_OK);
  if (size > 1) {
    CHECK_FAILS(gradsync_wait(h), GRADSYNC_ERROR_MISMATCH, "c.mismatch");
  } else {
    CHECK(gradsync_wait(h) == GRADSYNC_OK);
  }
  gradsync_release(h);
  float y[2] = {1, 1};
  int64_t yshape[1] = {2};
  CHECK(gradsync_allreduce_async("c.after", y, GRADSYNC_FLOAT32, yshape, 1, GRADSYNC_SUM, 1, 1, 0,
                                 &h) == GRADSYNC_OK);
  CHECK(gradsync_wait(h) == GRADSYNC_OK);
  CHECK(y[1] == (float)size);
  /* An allreduce has no output and no received splits of its own: asking is an error. */
  const void* out = NULL;
  const int64_t* out_shape = NULL;
  int ndim = 0, dtype = -1;
  CHECK_FAILS(gradsync_output(h, &out, &dtype, &out_shape, &ndim), GRADSYNC_ERROR_INVALID_ARGUMENT,
              "only an allgather, reducescatter or alltoall has an output");
  const int64_t* received = NULL;
  int count = 0;
  CHECK_FAILS(gradsync_received_splits(h, &received, &count), GRADSYNC_ERROR_INVALID_ARGUMENT,
              "only an alltoall has received splits");
  gradsync_release(h);

  /* A failed alltoall's received splits are its failure, not an empty success. */
  if (size > 1) {
    int64_t rows[4] = {0, 0, 0, 0};
    int64_t splits[4] = {0, 0, 0, 0};
    int64_t rshape[1] = {rank == 0 ? 0 : 1};
    if (rank != 0) splits[0] = 1;
    int32_t dtype_of_rank = rank == 0 ? GRADSYNC_INT64 : GRADSYNC_FLOAT64;
    CHECK(gradsync_alltoall_async("c.a2a.mismatch", rows, dtype_of_rank, rshape, 1, splits, size,
                                  GRADSYNC_GLOBAL_PROCESS_SET, &h) == GRADSYNC_OK);
    CHECK(gradsync_wait(h) == GRADSYNC_ERROR_MISMATCH);
    CHECK_FAILS(gradsync_received_splits(h, &received, &count), GRADSYNC_ERROR_MISMATCH,
                "c.a2a.mismatch");
    gradsync_release(h);
  }
}

static void ProcessSetsJoinBarrierTimeline(void) {
  int evens[4], count = 0;
  for (int r = 0; r < size; r += 2) evens[count++] = r;
  int set = -1;
  if (size > 1) {
    CHECK(gradsync_add_process_set(evens, count, &set) == GRADSYNC_OK);
    int set_rank = -2, set_size = 0;
    CHECK(gradsync_process_set_rank(set, &set_rank) == GRADSYNC_OK);
    CHECK(gradsync_process_set_size(set, &set_size) == GRADSYNC_OK);
    CHECK(set_size == count && set_rank == (rank % 2 == 0 ? rank / 2 : -1));
    if (set_rank >= 0) {
      float v[3] = {1, 1, 1};
      int64_t shape[1] = {3};
      gradsync_handle* h = NULL;
      CHECK(gradsync_allreduce_async("c.set", v, GRADSYNC_FLOAT32, shape, 1, GRADSYNC_SUM, 1, 1,
                                     set, &h) == GRADSYNC_OK);
      CHECK(gradsync_wait(h) == GRADSYNC_OK);
      CHECK(v[0] == (float)count);
      gradsync_release(h);
      CHECK(gradsync_barrier(set) == GRADSYNC_OK);
    }
    CHECK(gradsync_remove_process_set(set) == GRADSYNC_OK);
  }
  CHECK(gradsync_barrier(GRADSYNC_GLOBAL_PROCESS_SET) == GRADSYNC_OK);
  if (rank == 0) {
    CHECK(gradsync_start_timeline("c_api_test_timeline.json") == GRADSYNC_OK);
    CHECK(gradsync_stop_timeline() == GRADSYNC_OK);
  }
  int last = -1;
  CHECK(gradsync_join(&last) == GRADSYNC_OK);
  CHECK(last >= 0 && last < size);
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 4) {
    if (rank == 0) fprintf(stderr, "c_api_test runs on at most 4 ranks\n");
    MPI_Finalize();
    return 2;
  }
  int value = 0;
  CHECK_FAILS(gradsync_rank(&value), GRADSYNC_ERROR_NOT_INITIALIZED, "init");
  /* A freed communicator's handle, and one that never was: an error, not the job's end. */
  MPI_Comm freed = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &freed);
  const int stale = (int)MPI_Comm_c2f(freed);
  MPI_Comm_free(&freed);
  CHECK_FAILS(gradsync_init_comm(stale), GRADSYNC_ERROR_INVALID_ARGUMENT, "not a valid one");
  CHECK_FAILS(gradsync_init_comm(1 << 20), GRADSYNC_ERROR_INVALID_ARGUMENT, "not a valid one");
  CHECK(gradsync_init_comm((int)MPI_Comm_c2f(MPI_COMM_WORLD)) == GRADSYNC_OK);
  int initialized = 0;
  CHECK(gradsync_is_initialized(&initialized) == GRADSYNC_OK && initialized == 1);
  CHECK(gradsync_rank(&value) == GRADSYNC_OK && value == rank);
  CHECK(gradsync_size(&value) == GRADSYNC_OK && value == size);
  CHECK(gradsync_local_rank(&value) == GRADSYNC_OK && value >= 0);
  CHECK(gradsync_local_size(&value) == GRADSYNC_OK && value >= 1);
  CHECK(gradsync_gpu_device(&value) == GRADSYNC_OK && value >= -1);

  Allreduces();
  GathersAndScatters();
  Grouped();
  BadInput();
  MismatchThenWorking();
  ProcessSetsJoinBarrierTimeline();

  CHECK(gradsync_shutdown() == GRADSYNC_OK);
  CHECK(gradsync_is_initialized(&initialized) == GRADSYNC_OK && initialized == 0);
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("c_api_test: %d ranks, %d failed checks\n", size, total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
