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
// A round completes only once every rank's background thread has joined it, and every rank's
// thread does a round at least every 20 ms while it runs (BackgroundLoop). One that waits longer
// than GRADSYNC_STALL_WARNING_SECONDS means a peer's thread is not negotiating (it is stuck in a
// completion callback or an output allocator, or the process is stopped): the channel says so in
// a warning, again each such period, so that such a wait is never silent; past
// GRADSYNC_STALL_SHUTDOWN_SECONDS it gives up with Stalled, as the stall inspector does for a rank
// that stops submitting, so that such a wait does not hang the job either. An abandoned round's
// MPI request never completes here, but the stuck peer may still join it later and MPI would then
// write into its buffers: they are the channel's own, never the caller's, and are kept for the
// life of the process once abandoned; every later exchange fails with the same Stalled at once.
//
// Used by the background thread only.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/control_channel.h"

namespace gradsync {

// What a wait that lasts does: a warning naming `what` each `warn_every_seconds` it has waited
// (0: never), and Stalled once it has waited `give_up_seconds` (0: never).
struct LongWait {
  double warn_every_seconds = 0;
  std::string what;
  double give_up_seconds = 0;
};

class MpiControlChannel : public ControlChannel {
 public:
  // `spin_first`: poll without yielding for the first 200 microseconds.
  MpiControlChannel(MPI_Comm comm, bool spin_first, LongWait long_wait = {});
  ~MpiControlChannel() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllreduceAnd(std::vector<uint64_t>* words) override;
  Status Gather(const std::string& mine, std::vector<std::string>* all) override;
  Status Broadcast(std::string* bytes) override;
  void SetPatient(bool patient) override { patient_ = patient; }

 private:
  // What an exchange's MPI calls read and write while they are in flight (see above).
  struct Buffers {
    std::vector<uint64_t> words;
    int count = 0;
    std::vector<int> counts;
    std::vector<int> displs;
    std::string send;
    std::string received;
  };

  // Completes `request` as this channel waits now (see above); on a stall, abandons the buffers.
  Status Wait(MPI_Request* request, const char* call);

  MPI_Comm comm_;
  bool spin_first_;
  LongWait long_wait_;
  std::unique_ptr<Buffers> buffers_ = std::make_unique<Buffers>();
  Status stalled_;  // once a wait gave up: what every later exchange returns
  bool patient_ = false;
  int rank_ = 0;
  int size_ = 1;
};

// How WaitWithBackoff spends the first 200 microseconds, before it sleeps in growing steps.
enum class FirstLooks { kSpin, kYield, kNone };

// Completes `request` by MPI_Test with backoff (see above). `call` names the operation in errors
// and warnings; `long_wait`, when given, warns of a long wait and gives up on one (Stalled, with
// the request left pending).
Status WaitWithBackoff(MPI_Request* request, const char* call, FirstLooks first_looks,
                       const LongWait* long_wait = nullptr);

}  // namespace gradsync
