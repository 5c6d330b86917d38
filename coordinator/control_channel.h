// ControlChannel: the three collective exchanges negotiation needs, behind an interface so the
// negotiation logic runs the same over MPI (MpiControlChannel) and over N threads in one process
// (the unit tests' in-process channel).
//
// Every member is collective: all ranks call it, in the same order, from their background thread.
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
};

}  // namespace gradsync
