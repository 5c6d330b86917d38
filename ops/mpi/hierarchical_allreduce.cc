#include "ops/mpi/hierarchical_allreduce.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <vector>

#include "ops/mpi/mpi_data_plane.h"
#include "ops/mpi/mpi_types.h"
#include "ops/mpi/shared_memory_allreduce.h"
#include "runtime/logging.h"
#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

std::atomic<int> ranks_per_host_for_testing{0};

}  // namespace

void SetRanksPerHostForTesting(int ranks_per_host) { ranks_per_host_for_testing = ranks_per_host; }

HierarchicalAllreduce::HierarchicalAllreduce(MPI_Comm comm, bool requested,
                                             int64_t shm_threshold_bytes)
    : comm_(comm), requested_(requested), shm_threshold_bytes_(shm_threshold_bytes) {}

// The shared memory goes first: it holds no MPI handle, and the communicators it was made over
// are freed after it.
HierarchicalAllreduce::~HierarchicalAllreduce() {
  host_memory_.reset();
  if (!MpiUsable()) return;
  if (local_ != MPI_COMM_NULL) MPI_Comm_free(&local_);
  if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
}

Status HierarchicalAllreduce::Applies(bool* applies) {
  if (state_ == State::kUndecided) GRADSYNC_RETURN_IF_ERROR(Decide());
  *applies = state_ == State::kYes;
  return Status::OK();
}

Status HierarchicalAllreduce::Decide() {
  state_ = State::kNo;
  int rank = 0;
  GRADSYNC_MPI_CALL(MPI_Comm_rank(comm_, &rank));
  int requests[2] = {requested_ ? 1 : 0, requested_ ? -1 : 0};
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, requests, 2, MPI_INT, MPI_MAX, comm_));
  const bool some_asked = requests[0] == 1;
  const bool all_asked = requests[1] == -1;
  if (!some_asked) return Status::OK();
  if (!all_asked) {
    if (rank == 0) {
      Log().warn(
          "GRADSYNC_HIERARCHICAL_ALLREDUCE is set on some ranks only; set it alike on every rank. "
          "Allreduces stay flat");
    }
    return Status::OK();
  }
  if (const int per_host = ranks_per_host_for_testing.load(); per_host > 0) {
    GRADSYNC_MPI_CALL(MPI_Comm_split(comm_, rank / per_host, rank, &local_));
  } else {
    GRADSYNC_MPI_CALL(
        MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local_));
  }
  GRADSYNC_MPI_CALL(MPI_Comm_rank(local_, &local_rank_));
  GRADSYNC_MPI_CALL(MPI_Comm_size(local_, &local_size_));
  GRADSYNC_MPI_CALL(MPI_Comm_split(comm_, local_rank_, rank, &cross_));
  int hosts = 0;
  GRADSYNC_MPI_CALL(MPI_Comm_size(cross_, &hosts));
  // Slices only line up across hosts when every host cuts the bucket into as many parts; and the
  // threshold must be one value everywhere, since a host that tried shared memory for a bucket
  // another host sent through MPI would still meet it, but the ranks are told one rule.
  int sizes[2] = {local_size_, -local_size_};
  GRADSYNC_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm_));
  GRADSYNC_MPI_CALL(
      MPI_Allreduce(MPI_IN_PLACE, &shm_threshold_bytes_, 1, MPI_INT64_T, MPI_MIN, comm_));
  const int largest = sizes[0];
  const int smallest = -sizes[1];
  // Reached by every rank alike: the sizes were agreed above, and `hosts` is the same for every
  // local rank when every host has the same number of ranks.
  if (largest != smallest) {
    if (rank == 0) {
      Log().log(quiet_ ? spdlog::level::debug : spdlog::level::warn,
                "hierarchical allreduce requested, but the hosts run {} to {} ranks each; it needs "
                "the same number on every host, so allreduces stay flat",
                smallest, largest);
    }
    return Status::OK();
  }
  if (hosts < 2 || local_size_ < 2) {
    if (rank == 0) {
      Log().log(quiet_ ? spdlog::level::debug : spdlog::level::info,
                "hierarchical allreduce requested, but the ranks form {} host(s) of {} rank(s): "
                "allreduces stay flat",
                hosts, local_size_);
    }
    return Status::OK();
  }
  host_memory_ = std::make_unique<NodeSharedMemory>(local_, shm_threshold_bytes_,
                                                    MpiDataPlane::kSharedMemoryMaxRanks);
  state_ = State::kYes;
  return Status::OK();
}

Status HierarchicalAllreduce::AllreduceInPlace(void* buffer, int64_t count, size_t elem_size,
                                               MPI_Datatype type, MPI_Op op, int64_t piece_bytes) {
  if (count == 0) return Status::OK();
  std::vector<int> counts(static_cast<size_t>(local_size_));
  std::vector<int> displacements(static_cast<size_t>(local_size_));
  int64_t largest = 0;
  for (int q = 0; q < local_size_; ++q) {
    const ElementRange slice = SliceOf(count, elem_size, local_size_, q);
    largest = std::max(largest, slice.size());
    counts[static_cast<size_t>(q)] = static_cast<int>(std::min<int64_t>(slice.size(), INT_MAX));
    displacements[static_cast<size_t>(q)] =
        static_cast<int>(std::min<int64_t>(slice.begin, INT_MAX));
  }
  // MPI's int counts and displacements cannot address such a bucket within the host; every rank
  // sees the same count, so every rank goes flat together.
  if (largest > INT_MAX || count > INT_MAX) {
    return AllreduceInPieces(MPI_IN_PLACE, buffer, count, elem_size, type, op, comm_, piece_bytes);
  }
  auto* bytes = static_cast<char*>(buffer);
  const auto me = static_cast<size_t>(local_rank_);
  GRADSYNC_MPI_CALL(MPI_Reduce_scatter(MPI_IN_PLACE, buffer, counts.data(), type, op, local_));
  // In place, MPI leaves this rank's reduced slice at the front of the buffer.
  char* slice = bytes + static_cast<size_t>(displacements[me]) * elem_size;
  if (displacements[me] != 0) {
    std::memmove(slice, bytes, static_cast<size_t>(counts[me]) * elem_size);
  }
  GRADSYNC_RETURN_IF_ERROR(
      AllreduceInPieces(MPI_IN_PLACE, slice, counts[me], elem_size, type, op, cross_, piece_bytes));
  GRADSYNC_MPI_CALL(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer, counts.data(),
                                   displacements.data(), type, local_));
  return Status::OK();
}

}  // namespace gradsync
