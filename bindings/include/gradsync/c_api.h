/* gradsync's C API: a stable C ABI over the C++ library, for C, Fortran and other languages'
 * bindings, and for trainers built with another C++ compiler or standard library.
 *
 * Every function returns an error code, GRADSYNC_OK (0) on success; nothing is thrown across this
 * boundary. gradsync_last_error() gives the calling thread's message for its last failed call.
 * Every argument is checked: null pointers, negative counts, unknown dtypes and ops get
 * GRADSYNC_ERROR_INVALID_ARGUMENT and a message, never a crash.
 *
 * Memory: tensor data is host memory; the C API has no device argument, and a pointer into GPU
 * memory is read and written as host memory (use the C++ API's Device::Cuda for CUDA tensors).
 *
 * Ownership:
 *  - Tensor data passed in (`data`) stays the caller's. Keep it alive, and do not touch it, until
 *    the operation's handle reports completion (gradsync_wait, or gradsync_poll saying done).
 *  - Names, shapes, splits and rank lists are copied during the call; they may be freed after.
 *  - A handle (gradsync_handle) belongs to the caller from the call that returns it until
 *    gradsync_release, which must be called exactly once per handle, finished or not.
 *  - The output of allgather, reducescatter and alltoall is allocated by gradsync and belongs to
 *    the handle: gradsync_output's pointers stay valid until gradsync_release.
 *  - gradsync_last_error's string belongs to the calling thread and stays valid until its next
 *    call into this API.
 *
 * Thread safety: as the C++ API (<gradsync/gradsync.h>): gradsync_init* and gradsync_shutdown
 * must not race with each other or with any other call (a wait, a query of the rank or a process
 * set included), since shutdown frees what those read; everything else may be called from any
 * thread. A handle may be used by one thread at a time. gradsync_release waits for a pending
 * operation, and counts as a wait wherever it is called. */
#ifndef GRADSYNC_C_API_H_
#define GRADSYNC_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes; the values of the C++ API's StatusCode. */
enum {
  GRADSYNC_OK = 0,
  GRADSYNC_ERROR_INVALID_ARGUMENT = 1,
  GRADSYNC_ERROR_NOT_INITIALIZED = 2,
  GRADSYNC_ERROR_MISMATCH = 3,
  GRADSYNC_ERROR_STALLED = 4,
  GRADSYNC_ERROR_SHUTDOWN = 5,
  GRADSYNC_ERROR_TIMEOUT = 6,
  GRADSYNC_ERROR_MPI = 7,
  GRADSYNC_ERROR_CUDA = 8,
  GRADSYNC_ERROR_CORRUPT_MESSAGE = 9,
  GRADSYNC_ERROR_UNSUPPORTED = 10,
  GRADSYNC_ERROR_INTERNAL = 11
};

/* Data types; the values of the C++ API's DataType. float16 and bfloat16 are raw 16-bit storage. */
enum {
  GRADSYNC_UINT8 = 0,
  GRADSYNC_INT8 = 1,
  GRADSYNC_INT32 = 2,
  GRADSYNC_INT64 = 3,
  GRADSYNC_FLOAT16 = 4,
  GRADSYNC_BFLOAT16 = 5,
  GRADSYNC_FLOAT32 = 6,
  GRADSYNC_FLOAT64 = 7
};

/* Reduce ops; the values of the C++ API's ReduceOp. */
enum {
  GRADSYNC_SUM = 0,
  GRADSYNC_AVERAGE = 1,
  GRADSYNC_MIN = 2,
  GRADSYNC_MAX = 3,
  GRADSYNC_PRODUCT = 4,
  GRADSYNC_ADASUM = 5 /* allreduce of floating-point host tensors, power-of-two sets */
};

/* The global process set (every rank). Other sets' ids come from gradsync_add_process_set. */
#define GRADSYNC_GLOBAL_PROCESS_SET 0

typedef struct gradsync_handle gradsync_handle;

/* The calling thread's message for its last failed call ("" when none failed). */
const char* gradsync_last_error(void);

/* Starting and stopping. gradsync_init uses MPI_COMM_WORLD (initializing MPI when the application
 * has not); gradsync_init_comm an application's communicator, given as its Fortran handle
 * (MPI_Comm_c2f(comm) in C), so that this header needs no MPI header. Both are collective. */
int gradsync_init(void);
int gradsync_init_comm(int comm_fortran_handle);
int gradsync_shutdown(void);
int gradsync_is_initialized(int* initialized);

int gradsync_rank(int* rank);
int gradsync_size(int* size);
int gradsync_local_rank(int* local_rank);
int gradsync_local_size(int* local_size);
/* The CUDA device init picked for this rank (see gradsync::gpu_device()); -1 without a GPU. */
int gradsync_gpu_device(int* device);

/* Collectives. Each enqueues and returns at once with *handle set; `name` may be NULL or "" for a
 * generated name; `shape` holds `ndim` dimensions (ndim 0: a scalar, shape may be NULL). */

/* Reduces `data` in place across the process set's ranks. */
int gradsync_allreduce_async(const char* name, void* data, int dtype, const int64_t* shape,
                             int ndim, int op, double prescale, double postscale, int process_set,
                             gradsync_handle** handle);
/* Concatenates every rank's `data` along the first dimension (ranks may differ in it). */
int gradsync_allgather_async(const char* name, const void* data, int dtype, const int64_t* shape,
                             int ndim, int process_set, gradsync_handle** handle);
/* Overwrites `data` on every rank with the root's (a global rank, a member of the process set). */
int gradsync_broadcast_async(const char* name, void* data, int dtype, const int64_t* shape,
                             int ndim, int root, int process_set, gradsync_handle** handle);
/* Sends splits[r] rows of the first dimension to rank r (splits NULL and nsplits 0: the same
 * number to every rank, refused unless the rows divide by the ranks) and receives every rank's
 * rows for this one. */
int gradsync_alltoall_async(const char* name, const void* data, int dtype, const int64_t* shape,
                            int ndim, const int64_t* splits, int nsplits, int process_set,
                            gradsync_handle** handle);
/* Reduces `data` across ranks and leaves this rank its share of the first dimension. */
int gradsync_reducescatter_async(const char* name, const void* data, int dtype,
                                 const int64_t* shape, int ndim, int op, double prescale,
                                 double postscale, int process_set, gradsync_handle** handle);

/* Grouped forms: `count` tensors enqueued atomically and run together. names may be NULL (every
 * name generated); tensor i is data[i], dtypes[i], shapes[i] with ndims[i] dimensions; handles
 * receives `count` handles. */
int gradsync_grouped_allreduce_async(int count, const char* const* names, void* const* data,
                                     const int* dtypes, const int64_t* const* shapes,
                                     const int* ndims, int op, double prescale, double postscale,
                                     int process_set, gradsync_handle** handles);
int gradsync_grouped_allgather_async(int count, const char* const* names, const void* const* data,
                                     const int* dtypes, const int64_t* const* shapes,
                                     const int* ndims, int process_set, gradsync_handle** handles);
int gradsync_grouped_reducescatter_async(int count, const char* const* names,
                                         const void* const* data, const int* dtypes,
                                         const int64_t* const* shapes, const int* ndims, int op,
                                         double prescale, double postscale, int process_set,
                                         gradsync_handle** handles);

/* Handles. gradsync_poll sets *done (never blocks) and returns GRADSYNC_OK; gradsync_wait blocks
 * until done and returns the operation's own result code (its message in gradsync_last_error). */
int gradsync_poll(gradsync_handle* handle, int* done);
int gradsync_wait(gradsync_handle* handle);
int gradsync_release(gradsync_handle* handle);

/* The output of a finished allgather, reducescatter or alltoall: its data (NULL when empty), its
 * dtype and shape (`*ndim` dimensions at `*shape`). Owned by the handle. */
int gradsync_output(gradsync_handle* handle, const void** data, int* dtype, const int64_t** shape,
                    int* ndim);
/* A finished alltoall's rows received from each rank, in rank order. Owned by the handle. */
int gradsync_received_splits(gradsync_handle* handle, const int64_t** splits, int* count);

/* Process sets: collective over every rank, in the same order everywhere. */
int gradsync_add_process_set(const int* ranks, int count, int* process_set);
int gradsync_remove_process_set(int process_set);
/* This rank's rank within the set (-1 when not a member) and the set's size. */
int gradsync_process_set_rank(int process_set, int* rank);
int gradsync_process_set_size(int process_set, int* size);

/* Blocks until every rank has joined; *last_rank receives the rank that joined last. */
int gradsync_join(int* last_rank);
/* Blocks until every rank of the process set has entered the barrier. */
int gradsync_barrier(int process_set);

/* Timeline (rank 0 writes it; other ranks do nothing). */
int gradsync_start_timeline(const char* path);
int gradsync_stop_timeline(void);

#ifdef __cplusplus
}
#endif

#endif /* GRADSYNC_C_API_H_ */
