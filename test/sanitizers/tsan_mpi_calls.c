/* ThreadSanitizer builds only: the MPI calls that can make progress, run with the calling thread's
 * memory accesses ignored (its synchronization is still seen), through MPI's profiling interface.
 *
 * Open MPI is not instrumented, and any thread inside MPI progresses every pending request of the
 * process: the background thread waiting in a negotiation round copies a fragment into the buffer
 * that the device stream's thread is receiving, through a memcpy that ThreadSanitizer intercepts.
 * The thread that receives learns of it under Open MPI's own atomics, which it cannot see, so the
 * first read of each word of that buffer is a race whose writer has an Open MPI frame: suppressed
 * (tsan.supp), but only after ThreadSanitizer has rebuilt the writer's stack, once a word. A
 * received 280 KB tensor cost 35 000 of them, 10 to 20 s of one rank's time with the cores
 * oversubscribed, and the other ranks reported a stall. Ignoring what a thread touches inside MPI
 * loses nothing the suppressions report: every such access has an Open MPI frame.
 *
 * Test programs link this file; the library does not. A program's own definition of an MPI
 * function is the one that the library's calls reach. */
#include <mpi.h>

void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);

/* Defines MPI_<name>(params) as PMPI_<name>(args) with this thread's accesses ignored. */
#define GRADSYNC_IGNORED_MPI_CALL(name, params, args) \
  int MPI_##name params {                             \
    __tsan_ignore_thread_begin();                     \
    const int result = PMPI_##name args;              \
    __tsan_ignore_thread_end();                       \
    return result;                                    \
  }

/* Point to point and completion. */
GRADSYNC_IGNORED_MPI_CALL(Send,
                          (const void* buf, int count, MPI_Datatype type, int dest, int tag,
                           MPI_Comm comm),
                          (buf, count, type, dest, tag, comm))
GRADSYNC_IGNORED_MPI_CALL(Isend,
                          (const void* buf, int count, MPI_Datatype type, int dest, int tag,
                           MPI_Comm comm, MPI_Request* request),
                          (buf, count, type, dest, tag, comm, request))
GRADSYNC_IGNORED_MPI_CALL(Recv,
                          (void* buf, int count, MPI_Datatype type, int source, int tag,
                           MPI_Comm comm, MPI_Status* status),
                          (buf, count, type, source, tag, comm, status))
GRADSYNC_IGNORED_MPI_CALL(Irecv,
                          (void* buf, int count, MPI_Datatype type, int source, int tag,
                           MPI_Comm comm, MPI_Request* request),
                          (buf, count, type, source, tag, comm, request))
GRADSYNC_IGNORED_MPI_CALL(Iprobe,
                          (int source, int tag, MPI_Comm comm, int* flag, MPI_Status* status),
                          (source, tag, comm, flag, status))
GRADSYNC_IGNORED_MPI_CALL(Test, (MPI_Request * request, int* flag, MPI_Status* status),
                          (request, flag, status))
GRADSYNC_IGNORED_MPI_CALL(Wait, (MPI_Request * request, MPI_Status* status), (request, status))
GRADSYNC_IGNORED_MPI_CALL(Waitall, (int count, MPI_Request requests[], MPI_Status statuses[]),
                          (count, requests, statuses))

/* Collectives. */
GRADSYNC_IGNORED_MPI_CALL(Barrier, (MPI_Comm comm), (comm))
GRADSYNC_IGNORED_MPI_CALL(Bcast, (void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm),
                          (buf, count, type, root, comm))
GRADSYNC_IGNORED_MPI_CALL(Ibcast,
                          (void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
                           MPI_Request* request),
                          (buf, count, type, root, comm, request))
GRADSYNC_IGNORED_MPI_CALL(Allreduce,
                          (const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                           MPI_Comm comm),
                          (send, recv, count, type, op, comm))
GRADSYNC_IGNORED_MPI_CALL(Iallreduce,
                          (const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                           MPI_Comm comm, MPI_Request* request),
                          (send, recv, count, type, op, comm, request))
GRADSYNC_IGNORED_MPI_CALL(Reduce_scatter,
                          (const void* send, void* recv, const int counts[], MPI_Datatype type,
                           MPI_Op op, MPI_Comm comm),
                          (send, recv, counts, type, op, comm))
GRADSYNC_IGNORED_MPI_CALL(Gather,
                          (const void* send, int send_count, MPI_Datatype send_type, void* recv,
                           int recv_count, MPI_Datatype recv_type, int root, MPI_Comm comm),
                          (send, send_count, send_type, recv, recv_count, recv_type, root, comm))
GRADSYNC_IGNORED_MPI_CALL(Igather,
                          (const void* send, int send_count, MPI_Datatype send_type, void* recv,
                           int recv_count, MPI_Datatype recv_type, int root, MPI_Comm comm,
                           MPI_Request* request),
                          (send, send_count, send_type, recv, recv_count, recv_type, root, comm,
                           request))
GRADSYNC_IGNORED_MPI_CALL(Gatherv,
                          (const void* send, int send_count, MPI_Datatype send_type, void* recv,
                           const int recv_counts[], const int displs[], MPI_Datatype recv_type,
                           int root, MPI_Comm comm),
                          (send, send_count, send_type, recv, recv_counts, displs, recv_type, root,
                           comm))
GRADSYNC_IGNORED_MPI_CALL(Igatherv,
                          (const void* send, int send_count, MPI_Datatype send_type, void* recv,
                           const int recv_counts[], const int displs[], MPI_Datatype recv_type,
                           int root, MPI_Comm comm, MPI_Request* request),
                          (send, send_count, send_type, recv, recv_counts, displs, recv_type, root,
                           comm, request))
GRADSYNC_IGNORED_MPI_CALL(Allgather,
                          (const void* send, int send_count, MPI_Datatype send_type, void* recv,
                           int recv_count, MPI_Datatype recv_type, MPI_Comm comm),
                          (send, send_count, send_type, recv, recv_count, recv_type, comm))
GRADSYNC_IGNORED_MPI_CALL(Allgatherv,
                          (const void* send, int send_count, MPI_Datatype send_type, void* recv,
                           const int recv_counts[], const int displs[], MPI_Datatype recv_type,
                           MPI_Comm comm),
                          (send, send_count, send_type, recv, recv_counts, displs, recv_type, comm))
GRADSYNC_IGNORED_MPI_CALL(Alltoall,
                          (const void* send, int send_count, MPI_Datatype send_type, void* recv,
                           int recv_count, MPI_Datatype recv_type, MPI_Comm comm),
                          (send, send_count, send_type, recv, recv_count, recv_type, comm))
GRADSYNC_IGNORED_MPI_CALL(Alltoallv,
                          (const void* send, const int send_counts[], const int send_displs[],
                           MPI_Datatype send_type, void* recv, const int recv_counts[],
                           const int recv_displs[], MPI_Datatype recv_type, MPI_Comm comm),
                          (send, send_counts, send_displs, send_type, recv, recv_counts,
                           recv_displs, recv_type, comm))

/* Communicator creation and release, which communicate too. */
GRADSYNC_IGNORED_MPI_CALL(Comm_dup, (MPI_Comm comm, MPI_Comm* copy), (comm, copy))
GRADSYNC_IGNORED_MPI_CALL(Comm_split, (MPI_Comm comm, int color, int key, MPI_Comm* part),
                          (comm, color, key, part))
GRADSYNC_IGNORED_MPI_CALL(Comm_split_type,
                          (MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm* part),
                          (comm, split_type, key, info, part))
GRADSYNC_IGNORED_MPI_CALL(Comm_free, (MPI_Comm * comm), (comm))
GRADSYNC_IGNORED_MPI_CALL(Finalize, (void), ())
