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
                       const LongWait* long_wait) {
  const auto start = std::chrono::steady_clock::now();
  const auto after = [start](double seconds) {
    return start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(seconds));
  };
  const bool warns = long_wait != nullptr && long_wait->warn_every_seconds > 0;
  const bool gives_up = long_wait != nullptr && long_wait->give_up_seconds > 0;
  auto next_warning = warns ? after(long_wait->warn_every_seconds) : start;
  const auto give_up_at = gives_up ? after(long_wait->give_up_seconds) : start;
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
    const double waited = std::chrono::duration<double>(now - start).count();
    if (gives_up && now >= give_up_at) {
      return Status::Stalled(fmt::format(
          "{}: {} waited {:.1f} s for the other ranks (GRADSYNC_STALL_SHUTDOWN_SECONDS); a rank's "
          "background thread does not take part in negotiation (stuck in a completion callback "
          "or an output allocator, or its process stopped)",
          long_wait->what, call, waited));
    }
    if (warns && now >= next_warning) {
      Log().warn(
          "{}: {} has waited {:.1f} s for the other ranks; a rank whose background thread does "
          "not take part in negotiation (blocked, or in another part of the protocol) holds it",
          long_wait->what, call, waited);
      next_warning += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(long_wait->warn_every_seconds));
    }
    std::this_thread::sleep_for(sleep);
    sleep =
        std::min(sleep * 2, std::chrono::duration_cast<std::chrono::microseconds>(kLongestSleep));
  }
}

MpiControlChannel::MpiControlChannel(MPI_Comm comm, bool spin_first, LongWait long_wait)
    : comm_(comm), spin_first_(spin_first), long_wait_(std::move(long_wait)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiControlChannel::~MpiControlChannel() = default;

Status MpiControlChannel::Wait(MPI_Request* request, const char* call) {
  const FirstLooks first_looks =
      patient_ ? FirstLooks::kNone : (spin_first_ ? FirstLooks::kSpin : FirstLooks::kYield);
  Status status = WaitWithBackoff(request, call, first_looks, &long_wait_);
  if (status.code() == StatusCode::kStalled) {
    // The pending request may still write into the buffers, and touch the communicator (see the
    // header): the buffers are held from a static, so that they outlive this channel and no leak
    // checker counts them, and the communicator is never freed.
    static auto* abandoned = new std::vector<std::unique_ptr<Buffers>>();
    abandoned->push_back(std::move(buffers_));
    AbandonCommunicator(comm_);
    stalled_ = status;
  }
  return status;
}

Status MpiControlChannel::AllreduceAnd(std::vector<uint64_t>* words) {
  GRADSYNC_RETURN_IF_ERROR(stalled_);
  GRADSYNC_RETURN_IF_ERROR(CheckMessageSize(words->size() * 8, "negotiation bit vector"));
  std::vector<uint64_t>& reduced = buffers_->words;
  reduced.assign(words->begin(), words->end());
  MPI_Request request;
  GRADSYNC_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, reduced.data(), static_cast<int>(reduced.size()),
                                   MPI_UINT64_T, MPI_BAND, comm_, &request));
  GRADSYNC_RETURN_IF_ERROR(Wait(&request, "MPI_Iallreduce(negotiation bit vector)"));
  words->swap(reduced);
  return Status::OK();
}

Status MpiControlChannel::Gather(const std::string& mine, std::vector<std::string>* all) {
  GRADSYNC_RETURN_IF_ERROR(stalled_);
  GRADSYNC_RETURN_IF_ERROR(CheckMessageSize(mine.size(), "request list"));
  Buffers& b = *buffers_;
  b.send = mine;
  b.count = static_cast<int>(mine.size());
  b.counts.assign(rank_ == 0 ? size_ : 0, 0);
  MPI_Request request;
  GRADSYNC_MPI_CALL(
      MPI_Igather(&b.count, 1, MPI_INT, b.counts.data(), 1, MPI_INT, 0, comm_, &request));
  GRADSYNC_RETURN_IF_ERROR(Wait(&request, "MPI_Igather(request list sizes)"));

  b.displs.assign(b.counts.size(), 0);
  if (rank_ == 0) {
    size_t total = 0;
    for (int r = 0; r < size_; ++r) {
      b.displs[r] = static_cast<int>(total);
      total += static_cast<size_t>(b.counts[r]);
    }
    GRADSYNC_RETURN_IF_ERROR(CheckMessageSize(total, "gathered request lists"));
    b.received.resize(total);
  }
  GRADSYNC_MPI_CALL(MPI_Igatherv(b.send.data(), b.count, MPI_BYTE, b.received.data(),
                                 b.counts.data(), b.displs.data(), MPI_BYTE, 0, comm_, &request));
  GRADSYNC_RETURN_IF_ERROR(Wait(&request, "MPI_Igatherv(request lists)"));
  if (rank_ == 0) {
    all->resize(size_);
    for (int r = 0; r < size_; ++r) (*all)[r].assign(b.received, b.displs[r], b.counts[r]);
  }
  return Status::OK();
}

Status MpiControlChannel::Broadcast(std::string* bytes) {
  GRADSYNC_RETURN_IF_ERROR(stalled_);
  GRADSYNC_RETURN_IF_ERROR(CheckMessageSize(bytes->size(), "response list"));
  Buffers& b = *buffers_;
  b.count = static_cast<int>(bytes->size());
  MPI_Request request;
  GRADSYNC_MPI_CALL(MPI_Ibcast(&b.count, 1, MPI_INT, 0, comm_, &request));
  GRADSYNC_RETURN_IF_ERROR(Wait(&request, "MPI_Ibcast(response list size)"));
  if (rank_ == 0) {
    b.received.swap(*bytes);
  } else {
    b.received.resize(static_cast<size_t>(b.count));
  }
  GRADSYNC_MPI_CALL(MPI_Ibcast(b.received.data(), b.count, MPI_BYTE, 0, comm_, &request));
  GRADSYNC_RETURN_IF_ERROR(Wait(&request, "MPI_Ibcast(response list)"));
  bytes->swap(b.received);  // the buffer keeps the caller's old string's room for the next round
  return Status::OK();
}

}  // namespace gradsync
