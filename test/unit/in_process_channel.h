// An in-process ControlChannel: N ranks played by N threads of one test process, so negotiation is
// tested deterministically without MPI. A hub can hold one rank back before every exchange to play
// a slow or faulty peer. InProcessLockHub does the same for a locked schedule's LockChannel.
//
// Each Channel is used by its own rank's thread; the hub is shared by all of them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/control_channel.h"
#include "coordinator/lock_channel.h"

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

class InProcessLockHub {
 public:
  explicit InProcessLockHub(int size);

  std::unique_ptr<LockChannel> Channel(int rank);
  int size() const { return size_; }

  // The channels' side: exchange `number` (counted from 1 by each rank) of `rank`.
  void Deposit(int rank, uint64_t number, const std::vector<uint64_t>& words);
  // Makes every call of `rank`'s channel fail once its exchange `number` has started (a
  // library call failing): the start of the next exchange, and every look for nudges.
  void BreakAfter(int rank, uint64_t number);
  // Whether `rank`'s channel is broken, `next` being the exchange it starts next.
  bool Broken(int rank, uint64_t next);
  // The ranks other than `rank` that have not deposited exchange `number`.
  std::vector<int> NotDeposited(int rank, uint64_t number);
  // Whether every rank has deposited exchange `number`; if so *words is their AND.
  bool Completed(uint64_t number, std::vector<uint64_t>* words);
  void Nudge(int from, uint64_t sequence);
  uint64_t TakeNudges(int rank);
  // Exchanges opened (Open calls that were the first of their rank).
  int opened() const { return opened_; }
  void CountOpen() { ++opened_; }

 private:
  struct Exchange {
    int arrived = 0;
    int read = 0;
    std::vector<uint64_t> words;
  };
  int size_;
  std::mutex mu_;
  std::map<uint64_t, Exchange> exchanges_;
  std::vector<uint64_t> nudges_;
  std::vector<uint64_t> deposited_;       // per rank, the last exchange it deposited
  std::map<int, uint64_t> broken_after_;  // rank -> the last exchange its channel starts
  std::atomic<int> opened_{0};
};

}  // namespace gradsync
