// MpiControlChannel: the negotiation exchanges over gradsync's control communicator.
//
// Each exchange is a non-blocking MPI collective completed by polling with backoff: for the first
// 200 microseconds it polls without pause (the common case: peers arrive together), then it sleeps
// in growing steps, so a rank waiting on a stalled peer sleeps instead of burning a core in MPI's
// busy-wait. When the rank has no core to spare for the background thread
// (MpiContext::cores_per_rank() below 2), the first 200 microseconds yield the core between polls:
// on a node with fewer cores than threads, the thread that must run for the exchange to finish (a
// peer's, or this rank's own caller) may be waiting for exactly this core. Sleeping instead would
// cost a lone small collective hundreds of microseconds. A patient channel (SetPatient) skips the
// polling and sleeps from the first look.
//
// A round completes only once every rank's background thread has joined it. One that waits longer
// than GRADSYNC_STALL_WARNING_SECONDS means a peer's thread is not negotiating (it is stuck, or
// in another part of the protocol): the channel says so in a warning, again each such period,
// so that such a wait is never silent.
//
// Used by the background thread only.
#pragma once

#include <mpi.h>

#include <string>

#include "coordinator/control_channel.h"

namespace gradsync {

// Where a wait that lasts says so: a warning naming `what` each `every_seconds` it has waited
// (0: never).
struct LongWaitWarning {
  double every_seconds = 0;
  std::string what;
};

class MpiControlChannel : public ControlChannel {
 public:
  // `spin_first`: poll without yielding for the first 200 microseconds.
  MpiControlChannel(MPI_Comm comm, bool spin_first, LongWaitWarning long_wait = {});

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllreduceAnd(std::vector<uint64_t>* words) override;
  Status Gather(const std::string& mine, std::vector<std::string>* all) override;
  Status Broadcast(std::string* bytes) override;
  void SetPatient(bool patient) override { patient_ = patient; }

 private:
  // Completes `request` as this channel waits now (see above).
  Status Wait(MPI_Request* request, const char* call) const;

  MPI_Comm comm_;
  bool spin_first_;
  LongWaitWarning long_wait_;
  bool patient_ = false;
  int rank_ = 0;
  int size_ = 1;
};

// How WaitWithBackoff spends the first 200 microseconds, before it sleeps in growing steps.
enum class FirstLooks { kSpin, kYield, kNone };

// Completes `request` by MPI_Test with backoff (see above). `call` names the operation in errors
// and warnings; `long_wait`, when given, warns of a long wait.
Status WaitWithBackoff(MPI_Request* request, const char* call, FirstLooks first_looks,
                       const LongWaitWarning* long_wait = nullptr);

}  // namespace gradsync
