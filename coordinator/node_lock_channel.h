// NodeLockChannel: a locked schedule's exchanges through memory shared by the ranks when they all
// run on one node, and through MpiLockChannel when they do not (or when shared memory is refused
// or cannot be mapped). Every rank decides the same way, in Open().
//
// On one node an exchange is a store and a few loads: each rank owns a slot in one segment
// (ops/mpi/node_shared_memory.h), writes its words for exchange n into the slot's buffer n % 2 and
// then publishes n; an exchange is done once every rank has published it, and its AND is read
// from the slots. A rank overwrites buffer n % 2 only for exchange n + 2, which it starts after
// exchange n + 1 completed, so after every rank had published n + 1 and had therefore finished
// reading exchange n: two buffers are enough. A nudge raises the sender's published nudge; a
// receiver reports what rose since it last looked. No MPI call is made on a locked bucket's path:
// through MPI the exchange costs a small message round, which on an H200's machine was about the
// 100 us that two ranks sharing the GPU paid per small operation over staging by hand.
//
// Every member is called by one thread at a time (the background thread, or a caller's cycle under
// the loop's cycle lock).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "coordinator/lock_channel.h"
#include "coordinator/mpi_lock_channel.h"
#include "ops/mpi/node_shared_memory.h"

namespace gradsync {

class NodeLockChannel : public LockChannel {
 public:
  // Words one exchange carries at most through shared memory.
  static constexpr int kMaxWords = 8;

  // `control` must outlive the channel. With `shared_memory` false every exchange goes through
  // MPI, as across nodes; every rank must pass the same value.
  explicit NodeLockChannel(MPI_Comm control, bool shared_memory = true);
  ~NodeLockChannel() override;

  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  Status Open() override;
  Status StartAnd(const std::vector<uint64_t>& words) override;
  Status TestAnd(bool* done, std::vector<uint64_t>* words) override;
  Status Nudge(uint64_t sequence) override;
  Status TakeNudges(uint64_t* highest) override;
  std::vector<int> NotArrived(uint64_t sequence) const override;

  // Whether exchanges go through shared memory (decided by the first Open()).
  bool on_shared_memory() const { return memory_ != nullptr; }

 private:
  struct Slot;
  Slot* SlotOf(int rank) const;

  MPI_Comm control_;
  bool shared_memory_allowed_;
  bool decided_ = false;
  MpiLockChannel mpi_;
  MPI_Comm node_comm_ = MPI_COMM_NULL;        // the segment's, duplicated from control_
  std::unique_ptr<NodeSharedMemory> memory_;  // null: exchanges go through mpi_
  uint64_t sequence_ = 0;                     // exchanges started by this rank
  bool in_flight_ = false;
  size_t word_count_ = 0;
  std::vector<uint64_t> seen_nudges_;  // per rank, the nudge last reported
};

}  // namespace gradsync
