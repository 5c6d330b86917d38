// An in-process ControlChannel: N ranks played by N threads of one test process, so negotiation is
// tested deterministically without MPI. A hub can hold one rank back before every exchange to play
// a slow or faulty peer.
//
// Each Channel is used by its own rank's thread; the hub is shared by all of them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/control_channel.h"

namespace gradsync {

class InProcessHub {
 public:
  explicit InProcessHub(int size);

  std::unique_ptr<ControlChannel> Channel(int rank);
  // Every exchange `rank` takes part in starts `delay` late.
  void HoldBack(int rank, std::chrono::microseconds delay);
  int size() const { return size_; }

  // Every rank deposits `mine`; every rank gets all deposits, indexed by rank.
  std::vector<std::string> Exchange(int rank, std::string mine);

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<std::string> slots_;
  std::vector<std::string> result_;
  std::vector<std::chrono::microseconds> delays_;
};

}  // namespace gradsync
