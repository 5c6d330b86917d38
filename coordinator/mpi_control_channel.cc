#include "coordinator/mpi_control_channel.h"

#include <chrono>
#include <climits>
#include <string>
#include <thread>
#include <utility>

#include "runtime/logging.h"
#include "runtime/mpi_context.h"

namespace gradsync {

namespace {

constexpr auto kPollFor = std::chrono::microseconds(200);
constexpr auto kFirstSleep = std::chrono::microseconds(20);
// Short enough that a sleeping rank notices its peers' arrival quickly, long enough that polling
// costs well under 1% of a core.
constexpr auto kLongestSleep = std::chrono::microseconds(200);

Status CheckMessageSize(size_t bytes, const char* what) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    return Status::Internal(std::string(what) + " of " + std::to_string(bytes) +
                            " bytes exceeds MPI's int count");
  }
  return Status::OK();
}

}  // namespace

Status WaitWithBackoff(MPI_Request* request, const char* call, FirstLooks first_looks,
                       const LongWaitWarning* long_wait) {
  const auto start = std::chrono::steady_clock::now();
  const bool warns = long_wait != nullptr && long_wait->every_seconds > 0;
  const auto warn_every = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(warns ? long_wait->every_seconds : 0));
  auto next_warning = start + warn_every;
  auto sleep = kFirstSleep;
  for (;;) {
    int done = 0;
    GRADSYNC_RETURN_IF_ERROR(MpiResult(MPI_Test(request, &done, MPI_STATUS_IGNORE), call));
    if (done) return Status::OK();
    const auto now = std::chrono::steady_clock::now();
    if (first_looks != FirstLooks::kNone && now - start < kPollFor) {
      if (first_looks == FirstLooks::kYield) std::this_thread::yield();
      continue;
    }
    if (warns && now >= next_warning) {
      Log().warn(
          "{}: {} has waited {:.0f} s for the other ranks; a rank whose background thread does "
          "not take part in negotiation (blocked, or in another part of the protocol) holds it",
          long_wait->what, call, std::chrono::duration<double>(now - start).count());
      next_warning += warn_every;
    }
    std::this_thread::sleep_for(sleep);
    sleep =
        std::min(sleep * 2, std::chrono::duration_cast<std::chrono::microseconds>(kLongestSleep));
  }
}

MpiControlChannel::MpiControlChannel(MPI_Comm comm, bool spin_first, LongWaitWarning long_wait)
    : comm_(comm), spin_first_(spin_first), long_wait_(std::move(long_wait)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Status MpiControlChannel::Wait(MPI_Request* request, const char* call) const {
  const FirstLooks first_looks =
      patient_ ? FirstLooks::kNone : (spin_first_ ? FirstLooks::kSpin : FirstLooks::kYield);
  return WaitWithBackoff(request, call, first_looks, &long_wait_);
}

Status MpiControlChannel::AllreduceAnd(std::vector<uint64_t>* words) {
  GRADSYNC_RETURN_IF_ERROR(CheckMessageSize(words->size() * 8, "negotiation bit vector"));
  MPI_Request request;
  GRADSYNC_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, words->data(), static_cast<int>(words->size()),
                                   MPI_UINT64_T, MPI_BAND, comm_, &request));
  return Wait(&request, "MPI_Iallreduce(negotiation bit vector)");
}

Status MpiControlChannel::Gather(const std::string& mine, std::vector<std::string>* all) {
  GRADSYNC_RETURN_IF_ERROR(CheckMessageSize(mine.size(), "request list"));
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(rank_ == 0 ? size_ : 0);
  MPI_Request request;
  GRADSYNC_MPI_CALL(
      MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_, &request));
  GRADSYNC_RETURN_IF_ERROR(Wait(&request, "MPI_Igather(request list sizes)"));

  std::vector<int> displs(sizes.size());
  std::string packed;
  if (rank_ == 0) {
    size_t total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = static_cast<int>(total);
      total += static_cast<size_t>(sizes[r]);
    }
    GRADSYNC_RETURN_IF_ERROR(CheckMessageSize(total, "gathered request lists"));
    packed.resize(total);
  }
  GRADSYNC_MPI_CALL(MPI_Igatherv(mine.data(), my_size, MPI_BYTE, packed.data(), sizes.data(),
                                 displs.data(), MPI_BYTE, 0, comm_, &request));
  GRADSYNC_RETURN_IF_ERROR(Wait(&request, "MPI_Igatherv(request lists)"));
  if (rank_ == 0) {
    all->resize(size_);
    for (int r = 0; r < size_; ++r) (*all)[r] = packed.substr(displs[r], sizes[r]);
  }
  return Status::OK();
}

Status MpiControlChannel::Broadcast(std::string* bytes) {
  GRADSYNC_RETURN_IF_ERROR(CheckMessageSize(bytes->size(), "response list"));
  int size = static_cast<int>(bytes->size());
  MPI_Request request;
  GRADSYNC_MPI_CALL(MPI_Ibcast(&size, 1, MPI_INT, 0, comm_, &request));
  GRADSYNC_RETURN_IF_ERROR(Wait(&request, "MPI_Ibcast(response list size)"));
  bytes->resize(static_cast<size_t>(size));
  GRADSYNC_MPI_CALL(MPI_Ibcast(bytes->data(), size, MPI_BYTE, 0, comm_, &request));
  return Wait(&request, "MPI_Ibcast(response list)");
}

}  // namespace gradsync
