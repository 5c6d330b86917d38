#include "coordinator/mpi_lock_channel.h"

#include <algorithm>

#include "runtime/logging.h"
#include "runtime/mpi_context.h"

namespace gradsync {

namespace {

constexpr int kNudgeTag = 7301;

}  // namespace

MpiLockChannel::MpiLockChannel(MPI_Comm control) : control_(control) {
  MPI_Comm_rank(control_, &rank_);
  MPI_Comm_size(control_, &size_);
  heard_.assign(static_cast<size_t>(size_), 0);
}

MpiLockChannel::~MpiLockChannel() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // An exchange still in flight belongs to a set that failed, and its peers may never complete
  // it; MPI forbids freeing it, so the communicator under it is left as it is.
  if (exchange_ != MPI_REQUEST_NULL) return;
  const Status reaped = ReapSends(true);
  if (!reaped.ok()) Log().warn("locked schedule: {}", reaped.ToString());
  uint64_t ignored = 0;
  TakeNudges(&ignored);
  MPI_Comm_free(&comm_);
}

Status MpiLockChannel::Open() {
  if (comm_ != MPI_COMM_NULL) return Status::OK();
  GRADSYNC_MPI_CALL(MPI_Comm_dup(control_, &comm_));
  GRADSYNC_MPI_CALL(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  return Status::OK();
}

Status MpiLockChannel::StartAnd(const std::vector<uint64_t>& words) {
  if (exchange_ != MPI_REQUEST_NULL || alone_in_flight_) {
    return Status::Internal("locked schedule: two exchanges");
  }
  words_ = words;
  // Alone, the AND is the words themselves: no library call on a locked bucket's path.
  if (size_ == 1) {
    alone_in_flight_ = true;
    return Status::OK();
  }
  GRADSYNC_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, words_.data(), static_cast<int>(words_.size()),
                                   MPI_UINT64_T, MPI_BAND, comm_, &exchange_));
  return Status::OK();
}

Status MpiLockChannel::TestAnd(bool* done, std::vector<uint64_t>* words) {
  if (alone_in_flight_) {
    alone_in_flight_ = false;
    *done = true;
    *words = words_;
    return Status::OK();
  }
  int complete = 0;
  GRADSYNC_RETURN_IF_ERROR(MpiResult(MPI_Test(&exchange_, &complete, MPI_STATUS_IGNORE),
                                     "MPI_Test(locked bucket exchange)"));
  *done = complete != 0;
  if (*done) *words = words_;
  return Status::OK();
}

Status MpiLockChannel::Nudge(uint64_t sequence) {
  GRADSYNC_RETURN_IF_ERROR(ReapSends(false));
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Send send;
    send.sequence = std::make_unique<uint64_t>(sequence);
    GRADSYNC_MPI_CALL(
        MPI_Isend(send.sequence.get(), 1, MPI_UINT64_T, peer, kNudgeTag, comm_, &send.request));
    sends_.push_back(std::move(send));
  }
  return Status::OK();
}

Status MpiLockChannel::TakeNudges(uint64_t* highest) {
  *highest = 0;
  if (size_ == 1) return Status::OK();  // alone: no one to nudge, and no probe on a locked path
  GRADSYNC_RETURN_IF_ERROR(ReapSends(false));
  for (;;) {
    int waiting = 0;
    MPI_Status status;
    GRADSYNC_MPI_CALL(MPI_Iprobe(MPI_ANY_SOURCE, kNudgeTag, comm_, &waiting, &status));
    if (!waiting) return Status::OK();
    uint64_t sequence = 0;
    GRADSYNC_MPI_CALL(MPI_Recv(&sequence, 1, MPI_UINT64_T, status.MPI_SOURCE, kNudgeTag, comm_,
                               MPI_STATUS_IGNORE));
    *highest = std::max(*highest, sequence);
    uint64_t& heard = heard_[static_cast<size_t>(status.MPI_SOURCE)];
    heard = std::max(heard, sequence);
  }
}

std::vector<int> MpiLockChannel::NotArrived(uint64_t sequence) const {
  std::vector<int> ranks;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_ && heard_[static_cast<size_t>(peer)] < sequence) ranks.push_back(peer);
  }
  return ranks;
}

Status MpiLockChannel::ReapSends(bool all) {
  Status first;
  auto finished = [&](Send& send) {
    int complete = 0;
    const int rc = all ? MPI_Wait(&send.request, MPI_STATUS_IGNORE)
                       : MPI_Test(&send.request, &complete, MPI_STATUS_IGNORE);
    const Status result = MpiResult(rc, "MPI_Test(lock nudge)");
    if (!result.ok() && first.ok()) first = result;
    return all || complete != 0 || !result.ok();
  };
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(), finished), sends_.end());
  return first;
}

}  // namespace gradsync
