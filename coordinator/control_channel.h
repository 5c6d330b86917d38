// ControlChannel: the three collective exchanges negotiation needs, behind an interface so the
// negotiation logic runs the same over MPI (MpiControlChannel) and over N threads in one process
// (the unit tests' in-process channel).
//
// Every exchange is collective: all ranks call it, in the same order, from their background
// thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

class ControlChannel {
 public:
  virtual ~ControlChannel() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Bitwise AND of `words` across ranks, in place. Every rank passes the same length.
  virtual Status AllreduceAnd(std::vector<uint64_t>* words) = 0;
  // Rank 0 receives every rank's bytes, indexed by rank (its own included); others get nothing.
  virtual Status Gather(const std::string& mine, std::vector<std::string>* all) = 0;
  // Rank 0's `bytes` reach every rank.
  virtual Status Broadcast(std::string* bytes) = 0;

  // Not collective: how this rank waits for peers that have not arrived at an exchange yet. While
  // `patient`, it sleeps between looks from the first one instead of polling: its cycles have made
  // no progress for a while (a peer is late or stalled) and it backs off between them anyway, so
  // polling would only burn the core that the late peer, or this rank's caller, may need.
  virtual void SetPatient(bool patient) { (void)patient; }
};

}  // namespace gradsync
