// MpiControlChannel: the negotiation exchanges over gradsync's control communicator.
//
// Each exchange is a non-blocking MPI collective completed by polling with backoff: it spins for 50
// microseconds (the common case, peers arrive together), then sleeps in growing steps. A rank
// waiting on a stalled peer therefore sleeps instead of burning a core in MPI's busy-wait.
//
// Used by the background thread only.
#pragma once

#include <mpi.h>

#include "coordinator/control_channel.h"

namespace gradsync {

class MpiControlChannel : public ControlChannel {
 public:
  explicit MpiControlChannel(MPI_Comm comm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllreduceAnd(std::vector<uint64_t>* words) override;
  Status Gather(const std::string& mine, std::vector<std::string>* all) override;
  Status Broadcast(std::string* bytes) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

// Completes `request` by MPI_Test with backoff (see above). `call` names the operation in errors.
Status WaitWithBackoff(MPI_Request* request, const char* call);

}  // namespace gradsync
