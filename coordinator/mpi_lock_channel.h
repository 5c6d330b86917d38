// MpiLockChannel: a locked schedule's exchanges over a communicator of their own, duplicated from
// the process set's control communicator when the set first locks, so that they never pair with
// a negotiation round. Exchanges are MPI_Iallreduce(MPI_BAND); nudges are small tagged messages,
// sent without waiting and drained with MPI_Iprobe.
//
// Used by one thread at a time: the background thread, or a caller's cycle under the loop's cycle
// lock (BackgroundLoop::RunCycleForCaller).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "coordinator/lock_channel.h"

namespace gradsync {

class MpiLockChannel : public LockChannel {
 public:
  // `control` must outlive the channel.
  explicit MpiLockChannel(MPI_Comm control);
  ~MpiLockChannel() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Open() override;
  Status StartAnd(const std::vector<uint64_t>& words) override;
  Status TestAnd(bool* done, std::vector<uint64_t>* words) override;
  Status Nudge(uint64_t sequence) override;
  Status TakeNudges(uint64_t* highest) override;
  std::vector<int> NotArrived(uint64_t sequence) const override;

 private:
  // Completes the nudges whose sends have gone; at teardown, waits for all of them.
  Status ReapSends(bool all);

  MPI_Comm control_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<uint64_t> words_;
  MPI_Request exchange_ = MPI_REQUEST_NULL;
  bool alone_in_flight_ = false;  // a set of one rank: its exchange is its own words
  struct Send {
    std::unique_ptr<uint64_t> sequence;  // the buffer, fixed until the send completes
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::vector<Send> sends_;
  std::vector<uint64_t> heard_;  // per rank, the highest sequence it nudged about
};

}  // namespace gradsync
