#include "ops/device/host_device_backend.h"

#include <malloc.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "ops/mpi/mpi_types.h"
#include "runtime/fusion_buffer.h"
#include "runtime/logging.h"
#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

// The lanes of a simulated block: any count gives the same bytes; several exercise the stride.
constexpr int kHostLanes = 32;

Status IntCounts(const std::vector<int64_t>& counts, std::vector<int>* ints,
                 std::vector<int>* displacements) {
  ints->resize(counts.size());
  displacements->resize(counts.size());
  int64_t offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > INT_MAX || offset > INT_MAX) {
      return Status::Unsupported("the host device backend takes at most INT_MAX elements");
    }
    (*ints)[r] = static_cast<int>(counts[r]);
    (*displacements)[r] = static_cast<int>(offset);
    offset += counts[r];
  }
  return Status::OK();
}

void LogAndAbortTheJob(const std::string& message) {
  Log().error("{}", message);
  Log().flush();
  MPI_Abort(MPI_COMM_WORLD, 1);
}

std::atomic<HostDeviceBackend::StuckCollectiveHandler> g_stuck_handler{&LogAndAbortTheJob};

// How often the destructor says again that it waits, where no limit ends the wait.
constexpr std::chrono::seconds kStuckReminder(60);

std::atomic<int64_t> g_device_bytes_held{0};

// Frees what Allocate handed out, and counts it out of the device bytes held.
void FreeDeviceBytes(void* ptr) {
  g_device_bytes_held.fetch_sub(static_cast<int64_t>(malloc_usable_size(ptr)),
                                std::memory_order_relaxed);
  std::free(ptr);
}

}  // namespace

HostDeviceBackend::HostDeviceBackend(MPI_Comm comm, std::chrono::nanoseconds stuck_limit)
    : comm_(comm), stuck_limit_(std::min(stuck_limit, kWaitForever)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Status HostDeviceBackend::Create(MPI_Comm comm, std::unique_ptr<HostDeviceBackend>* backend,
                                 std::chrono::nanoseconds stuck_limit) {
  // The stream's thread calls MPI while the loop's does: agreed, so every rank refuses alike.
  int level = MPI_THREAD_SINGLE;
  GRADSYNC_MPI_CALL(MPI_Query_thread(&level));
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, &level, 1, MPI_INT, MPI_MIN, comm));
  if (level < MPI_THREAD_MULTIPLE) {
    return Status::Unsupported(
        "the MPI backend for device tensors calls MPI from a thread of its own beside gradsync's "
        "background thread, which needs MPI_THREAD_MULTIPLE on every rank, and MPI was "
        "initialized with less; initialize MPI with MPI_THREAD_MULTIPLE (or let gradsync "
        "initialize it), or give each rank a GPU of its own for NCCL");
  }
  MPI_Comm dup = MPI_COMM_NULL;
  GRADSYNC_MPI_CALL(MPI_Comm_dup(comm, &dup));
  backend->reset(new HostDeviceBackend(dup, stuck_limit));
  return Status::OK();
}

void HostDeviceBackend::SetStuckCollectiveHandlerForTesting(StuckCollectiveHandler handler) {
  g_stuck_handler.store(handler != nullptr ? handler : &LogAndAbortTheJob);
}

HostDeviceBackend::~HostDeviceBackend() {
  // The stream's thread must be done with the communicator first: drain it. An aborted stream
  // refuses the record at once, while its thread may still run an item, a collective among them.
  const Status drained = stream_.Record()->Wait(kWaitForever);
  if (!drained.ok()) AwaitStuckCollective(drained);
  MPI_Comm_free(&comm_);
  std::lock_guard<std::mutex> lock(unfreed_mu_);
  for (void* ptr : unfreed_) FreeDeviceBytes(ptr);
}

void HostDeviceBackend::AwaitStuckCollective(const Status& aborted) {
  const auto start = std::chrono::steady_clock::now();
  auto next_warning = start + std::min<std::chrono::nanoseconds>(stuck_limit_, kStuckReminder);
  const auto describe = [&](const char* call, std::chrono::steady_clock::time_point now) {
    return std::string("the device plane was aborted (") + aborted.ToString() +
           ") while its stream was inside " +
           (call != nullptr ? std::string(call) + ", which another rank has not entered,"
                            : std::string("a step of its work")) +
           " and is still there after " +
           std::to_string(std::chrono::duration<double>(now - start).count()) + " s";
  };
  bool handled = false;
  // Until the thread has left the item it runs: a collective about to start is one too.
  while (stream_.running()) {
    const auto now = std::chrono::steady_clock::now();
    const char* call = in_collective_.load();
    if (!handled && call != nullptr && now - start >= stuck_limit_) {
      // Past the completion timeout every other rank has entered it or dropped it: MPI offers no
      // way out of it, and the thread inside would never stop.
      g_stuck_handler.load()(describe(call, now) +
                             "; MPI cannot abandon a collective, so the job ends");
      handled = true;
    } else if (!handled && now >= next_warning) {
      Log().warn("{}; waiting for it", describe(call, now));
      next_warning = now + kStuckReminder;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status HostDeviceBackend::Collective(const char* call, const std::function<int()>& mpi) {
  return InCollective(call, [&] { return MpiResult(mpi(), call); });
}

Status HostDeviceBackend::InCollective(const char* call, const std::function<Status()>& work) {
  in_collective_.store(call);
  const Status status = work();
  in_collective_.store(nullptr);
  return status;
}

void HostDeviceBackend::Enqueue(std::function<Status()> work) {
  stream_.Enqueue([this, work = std::move(work)] {
    const Status status = work();
    if (!status.ok()) stream_.Abort(status);
  });
}

Status HostDeviceBackend::Allocate(size_t bytes, void** ptr) {
  const size_t rounded = AlignFusionOffset(bytes == 0 ? 1 : bytes);
  *ptr = std::aligned_alloc(FusionBuffer::kAlignment, rounded);
  if (*ptr == nullptr) {
    return Status::Internal("out of host memory for " + std::to_string(bytes) + " bytes");
  }
  g_device_bytes_held.fetch_add(static_cast<int64_t>(malloc_usable_size(*ptr)),
                                std::memory_order_relaxed);
  return Status::OK();
}

int64_t HostDeviceBackend::DeviceBytesHeld() {
  return g_device_bytes_held.load(std::memory_order_relaxed);
}

void HostDeviceBackend::FreeAfterWork(void* ptr) {
  // Freed when the stream reaches it. An aborted stream drops it, and may still be inside work
  // that uses it (a collective another rank may yet enter): the destructor frees it after that.
  {
    std::lock_guard<std::mutex> lock(unfreed_mu_);
    unfreed_.push_back(ptr);
  }
  stream_.Enqueue([this, ptr] {
    {
      std::lock_guard<std::mutex> lock(unfreed_mu_);
      unfreed_.erase(std::find(unfreed_.begin(), unfreed_.end(), ptr));
    }
    FreeDeviceBytes(ptr);
  });
}

Status HostDeviceBackend::Upload(const void* host, void* dst, size_t bytes) {
  stream_.Enqueue([=] { std::memcpy(dst, host, bytes); });
  return stream_.Record()->Wait(kWaitForever);
}

Status HostDeviceBackend::BatchedCopy(const std::vector<CopySegment>& segments, DataType dtype) {
  Enqueue([segments, dtype] { return RunBatchedCopyOnHost(segments, dtype, kHostLanes); });
  return Status::OK();
}

Status HostDeviceBackend::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                    ReduceOp op) {
  if (count > INT_MAX) {
    return Status::Unsupported("the host device backend takes at most INT_MAX elements");
  }
  MPI_Op mpi_op = MPI_OP_NULL;
  GRADSYNC_RETURN_IF_ERROR(MpiReduceOpOf(dtype, op, &mpi_op));  // on the background thread
  const MPI_Datatype type = MpiDatatypeOf(dtype);
  MPI_Comm comm = comm_;
  Enqueue([=] {
    // In place on every rank: MPI_IN_PLACE must be all ranks' or none's, and a joined rank's
    // stand-in, or another rank's in-place tensor, reduces in place.
    if (send != recv) std::memcpy(recv, send, static_cast<size_t>(count) * DataTypeSize(dtype));
    return Collective("MPI_Allreduce", [&] {
      return MPI_Allreduce(MPI_IN_PLACE, recv, static_cast<int>(count), type, mpi_op, comm);
    });
  });
  return Status::OK();
}

Status HostDeviceBackend::Allgatherv(const void* send, void* recv,
                                     const std::vector<int64_t>& counts, DataType dtype) {
  std::vector<int> ints;
  std::vector<int> displacements;
  GRADSYNC_RETURN_IF_ERROR(IntCounts(counts, &ints, &displacements));
  const MPI_Datatype type = MpiDatatypeOf(dtype);
  MPI_Comm comm = comm_;
  const int mine = ints[rank_];
  Enqueue([=] {
    return Collective("MPI_Allgatherv", [&] {
      return MPI_Allgatherv(send, mine, type, recv, ints.data(), displacements.data(), type, comm);
    });
  });
  return Status::OK();
}

Status HostDeviceBackend::Broadcast(void* buffer, int64_t count, DataType dtype, int root) {
  if (count > INT_MAX) {
    return Status::Unsupported("the host device backend takes at most INT_MAX elements");
  }
  const MPI_Datatype type = MpiDatatypeOf(dtype);
  MPI_Comm comm = comm_;
  Enqueue([=] {
    return Collective("MPI_Bcast",
                      [&] { return MPI_Bcast(buffer, static_cast<int>(count), type, root, comm); });
  });
  return Status::OK();
}

Status HostDeviceBackend::Alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                                    void* recv, const std::vector<int64_t>& recv_counts,
                                    DataType dtype) {
  std::vector<int> sends, send_displacements, receives, receive_displacements;
  GRADSYNC_RETURN_IF_ERROR(IntCounts(send_counts, &sends, &send_displacements));
  GRADSYNC_RETURN_IF_ERROR(IntCounts(recv_counts, &receives, &receive_displacements));
  const MPI_Datatype type = MpiDatatypeOf(dtype);
  MPI_Comm comm = comm_;
  Enqueue([=] {
    return Collective("MPI_Alltoallv", [&] {
      return MPI_Alltoallv(send, sends.data(), send_displacements.data(), type, recv,
                           receives.data(), receive_displacements.data(), type, comm);
    });
  });
  return Status::OK();
}

Status HostDeviceBackend::ReduceScatterv(const void* send, void* recv,
                                         const std::vector<int64_t>& counts, DataType dtype,
                                         ReduceOp op) {
  std::vector<int> ints;
  std::vector<int> displacements;
  GRADSYNC_RETURN_IF_ERROR(IntCounts(counts, &ints, &displacements));
  MPI_Op mpi_op = MPI_OP_NULL;
  GRADSYNC_RETURN_IF_ERROR(MpiReduceOpOf(dtype, op, &mpi_op));
  const MPI_Datatype type = MpiDatatypeOf(dtype);
  MPI_Comm comm = comm_;
  Enqueue([=] {
    return Collective("MPI_Reduce_scatter", [&] {
      return MPI_Reduce_scatter(send, recv, ints.data(), type, mpi_op, comm);
    });
  });
  return Status::OK();
}

Status HostDeviceBackend::Adasum(void* data, DataType dtype, int64_t count,
                                 const std::vector<ElementRange>& tensors, double prescale,
                                 double postscale) {
  Enqueue([this, data, dtype, count, tensors, prescale, postscale] {
    return InCollective("Adasum", [&] {
      return AdasumBuffer(data, dtype, count, tensors, prescale, postscale, comm_,
                          &adasum_scratch_);
    });
  });
  return Status::OK();
}

}  // namespace gradsync
