// DeviceBackend: the narrow interface the device data plane (device_plane.h) is written against:
// one communication stream, memory, the batched copy, and collectives enqueued on that stream.
// Three implementations: NCCL (ops/nccl/), MPI staged through pinned host memory (ops/cuda/), and
// host memory with threads as streams and MPI as the collective (host_device_backend.h), which is
// how the plane's logic runs in the tests of machines without a GPU.
//
// Every enqueueing call returns once the work is queued (Adasum on NCCL excepted: see
// nccl_backend.h): the Status says whether queueing worked. Failures while the work runs fail the
// stream, so that the events recorded on it after that work complete with the failure.
//
// Thread safety: everything but CheckAsyncError and Abort is called by the background thread;
// those two by the finalizer, at any time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/device/batched_copy.h"
#include "ops/element_range.h"
#include "runtime/stream.h"

namespace gradsync {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // "nccl", "mpi", "host": for messages.
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The communication stream every call below enqueues on, in call order.
  virtual Stream* stream() = 0;

  // Memory where the backend's tensors live: allocated at once; freed once the work enqueued so
  // far has run.
  virtual Status Allocate(size_t bytes, void** ptr) = 0;
  virtual void FreeAfterWork(void* ptr) = 0;
  // Copies `bytes` from host memory into the backend's memory before returning, after the work
  // enqueued so far: for joined ranks' stand-ins, made while the rank has nothing else to do.
  virtual Status Upload(const void* host, void* dst, size_t bytes) = 0;

  // The batched copy (batched_copy.h) of `segments`, in the backend's memory.
  virtual Status BatchedCopy(const std::vector<CopySegment>& segments, DataType dtype) = 0;

  // Collectives over the backend's ranks; counts in elements. `op` is never kAverage (the plane
  // sums and scales). Send and receive buffers may be the same only where said.
  //
  // recv may equal send.
  virtual Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  // Rank r's `counts[r]` elements, concatenated in rank order into recv.
  virtual Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DataType dtype) = 0;
  virtual Status Broadcast(void* buffer, int64_t count, DataType dtype, int root) = 0;
  // send holds send_counts[r] elements for each rank r in rank order; recv receives
  // recv_counts[r] from each.
  virtual Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                           const std::vector<int64_t>& recv_counts, DataType dtype) = 0;
  // send holds counts[r] elements for each rank r in rank order, summed (by `op`) across ranks;
  // recv receives this rank's counts[rank()] of the result.
  virtual Status ReduceScatterv(const void* send, void* recv, const std::vector<int64_t>& counts,
                                DataType dtype, ReduceOp op) = 0;

  // Replaces `count` elements of `dtype` (floating point) at `data`, packed tensors `tensors`, by
  // `postscale` times their Adasum over the backend's ranks of `prescale` times them, as
  // AdasumBuffer (ops/mpi/adasum.h) combines host memory: no collective library offers Adasum, so
  // the host computes it, over MPI, and a backend whose memory the host cannot read stages the
  // bucket through host memory. The result is the MPI plane's for the same packed bucket, bit for
  // bit.
  virtual Status Adasum(void* data, DataType dtype, int64_t count,
                        const std::vector<ElementRange>& tensors, double prescale,
                        double postscale) = 0;

  // Errors the library reports outside any call (NCCL's asynchronous errors); OK otherwise. Never
  // blocks behind a call in progress on the background thread (OK then: asked again later), so
  // that a poller stays free to reach its deadline and Abort.
  virtual Status CheckAsyncError() = 0;
  // Abandons the work in flight (aborting the communicator where stuck work waits on peers) and
  // fails the stream with `status`. Later calls fail.
  virtual void Abort(const Status& status) = 0;
};

}  // namespace gradsync
