#include "ops/mpi/node_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/logging.h"
#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

constexpr size_t kPageBytes = 4096;
constexpr int kNameBytes = 64;

// Segment names only need to be unique among the segments rank 0 of some communicator creates at
// the same time on this node: its process id and a counter are.
std::string NewSegmentName() {
  static std::atomic<unsigned> counter{0};
  return "/gradsync-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

// Why a mapping step failed, for the one warning that turns the path off.
std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

NodeSharedMemory::NodeSharedMemory(MPI_Comm comm, int64_t max_bytes, int max_ranks)
    : comm_(comm), max_bytes_(max_bytes), max_ranks_(max_ranks) {}

NodeSharedMemory::~NodeSharedMemory() { Unmap(); }

Status NodeSharedMemory::Prepare(size_t bytes, bool* usable) {
  *usable = false;
  if (state_ == State::kUndecided) GRADSYNC_RETURN_IF_ERROR(Decide());
  // Every rank holds the same agreed limit and region size, so every rank takes the same branch.
  if (state_ == State::kOff || bytes > static_cast<size_t>(max_bytes_)) return Status::OK();
  if (bytes > region_bytes_) {
    // Doubling keeps a slowly growing bucket from remapping every step.
    const size_t grown = std::max(bytes, std::min(2 * region_bytes_, size_t(max_bytes_)));
    GRADSYNC_RETURN_IF_ERROR(Map((grown + kPageBytes - 1) / kPageBytes * kPageBytes));
    if (state_ == State::kOff) return Status::OK();
  }
  *usable = true;
  return Status::OK();
}

Status NodeSharedMemory::Decide() {
  state_ = State::kOff;
  GRADSYNC_MPI_CALL(MPI_Comm_size(comm_, &size_));
  GRADSYNC_MPI_CALL(MPI_Comm_rank(comm_, &rank_));
  if (size_ == 1 || size_ > max_ranks_) return Status::OK();
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, &max_bytes_, 1, MPI_INT64_T, MPI_MIN, comm_));
  if (max_bytes_ <= 0) return Status::OK();
  // If the ranks span nodes, no node holds all of them, so every rank sees a smaller node group.
  MPI_Comm node = MPI_COMM_NULL;
  GRADSYNC_MPI_CALL(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  int node_size = 0;
  const int rc = MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  GRADSYNC_RETURN_IF_ERROR(MpiResult(rc, "MPI_Comm_size(node communicator)"));
  if (node_size == size_) state_ = State::kOn;
  return Status::OK();
}

// Rank 0 creates and sizes the segment, every rank maps it, and the ranks agree on success before
// rank 0 unlinks it. posix_fallocate reserves the memory up front, so a full /dev/shm is an error
// here rather than a SIGBUS at the first store.
Status NodeSharedMemory::Map(size_t region_bytes) {
  const size_t total = region_bytes * (2 * static_cast<size_t>(size_) + 1);
  char name[kNameBytes] = {};
  std::string failure;
  int fd = -1;
  bool created = false;
  if (rank_ == 0) {
    const std::string fresh = NewSegmentName();
    fd = shm_open(fresh.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    created = fd >= 0;
    if (fd < 0) {
      failure = Errno("shm_open");
    } else if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
      errno = err;
      failure = Errno("posix_fallocate");
    }
    std::snprintf(name, sizeof(name), "%s", fresh.c_str());
  }
  if (const int rc = MPI_Bcast(name, kNameBytes, MPI_CHAR, 0, comm_); rc != MPI_SUCCESS) {
    if (fd >= 0) close(fd);
    if (created) shm_unlink(name);  // nothing is left in /dev/shm, on this path too
    return MpiResult(rc, "MPI_Bcast(shared memory name)");
  }
  if (rank_ != 0) {
    fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) failure = Errno("shm_open");
  }
  void* mapped = MAP_FAILED;
  if (failure.empty()) {
    mapped = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) failure = Errno("mmap");
  }
  if (fd >= 0) close(fd);
  int ok = failure.empty() ? 1 : 0;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm_);
  if (created) shm_unlink(name);
  if (rc != MPI_SUCCESS || !ok) {
    if (mapped != MAP_FAILED) munmap(mapped, total);
    GRADSYNC_RETURN_IF_ERROR(MpiResult(rc, "MPI_Allreduce(shared memory mapped)"));
    state_ = State::kOff;
    Unmap();
    Log().warn(
        "shared memory of {} bytes could not be mapped on every rank ({}); fused allreduces "
        "go through MPI messages from now on",
        total, failure.empty() ? "failed on another rank" : failure);
    return Status::OK();
  }
  Unmap();
  base_ = static_cast<char*>(mapped);
  mapped_bytes_ = total;
  region_bytes_ = region_bytes;
  current_ = 0;
  return Status::OK();
}

void NodeSharedMemory::Unmap() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
  base_ = nullptr;
  mapped_bytes_ = 0;
  region_bytes_ = 0;
}

char* NodeSharedMemory::Region(int rank) const {
  return base_ + (static_cast<size_t>(rank) * 2 + static_cast<size_t>(current_)) * region_bytes_;
}

char* NodeSharedMemory::Result() const {
  return base_ + 2 * static_cast<size_t>(size_) * region_bytes_;
}

// The fences keep the compiler (and weakly ordered CPUs) from moving the region accesses across
// the barrier, which MPI does not promise for memory it does not manage.
Status NodeSharedMemory::Barrier() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  GRADSYNC_MPI_CALL(MPI_Barrier(comm_));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return Status::OK();
}

}  // namespace gradsync
