#include "test/unit/in_process_channel.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

namespace gradsync {

namespace {

class InProcessChannel : public ControlChannel {
 public:
  InProcessChannel(InProcessHub* hub, int rank) : hub_(hub), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }

  Status AllreduceAnd(std::vector<uint64_t>* words) override {
    std::string mine(reinterpret_cast<const char*>(words->data()), words->size() * 8);
    const auto all = hub_->Exchange(rank_, std::move(mine));
    for (const std::string& other : all) {
      if (other.size() != words->size() * 8) {
        return Status::Internal("bit vectors of different lengths");
      }
      for (size_t i = 0; i < words->size(); ++i) {
        uint64_t w;
        std::memcpy(&w, other.data() + i * 8, 8);
        (*words)[i] &= w;
      }
    }
    return Status::OK();
  }

  Status Gather(const std::string& mine, std::vector<std::string>* all) override {
    auto gathered = hub_->Exchange(rank_, mine);
    if (rank_ == 0) *all = std::move(gathered);
    return Status::OK();
  }

  Status Broadcast(std::string* bytes) override {
    *bytes = hub_->Exchange(rank_, *bytes)[0];
    return Status::OK();
  }

 private:
  InProcessHub* hub_;
  int rank_;
};

class InProcessLockChannel : public LockChannel {
 public:
  InProcessLockChannel(InProcessLockHub* hub, int rank) : hub_(hub), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  Status Open() override {
    if (!opened_) hub_->CountOpen();
    opened_ = true;
    return Status::OK();
  }
  Status StartAnd(const std::vector<uint64_t>& words) override {
    if (!opened_) return Status::Internal("exchange before Open");
    if (in_flight_) return Status::Internal("two exchanges in flight");
    if (hub_->Broken(rank_, started_ + 1)) return Status::Internal("the test broke the channel");
    in_flight_ = true;
    hub_->Deposit(rank_, ++started_, words);
    return Status::OK();
  }
  Status TestAnd(bool* done, std::vector<uint64_t>* words) override {
    if (!in_flight_) return Status::Internal("no exchange in flight");
    *done = hub_->Completed(started_, words);
    if (*done) in_flight_ = false;
    return Status::OK();
  }
  Status Nudge(uint64_t sequence) override {
    hub_->Nudge(rank_, sequence);
    return Status::OK();
  }
  Status TakeNudges(uint64_t* highest) override {
    if (hub_->Broken(rank_, started_ + 1)) return Status::Internal("the test broke the channel");
    *highest = hub_->TakeNudges(rank_);
    return Status::OK();
  }
  std::vector<int> NotArrived(uint64_t sequence) const override {
    return hub_->NotDeposited(rank_, sequence);
  }

 private:
  InProcessLockHub* hub_;
  int rank_;
  bool opened_ = false;
  bool in_flight_ = false;
  uint64_t started_ = 0;
};

}  // namespace

InProcessLockHub::InProcessLockHub(int size) : size_(size), nudges_(size, 0), deposited_(size, 0) {}

std::unique_ptr<LockChannel> InProcessLockHub::Channel(int rank) {
  return std::make_unique<InProcessLockChannel>(this, rank);
}

void InProcessLockHub::Deposit(int rank, uint64_t number, const std::vector<uint64_t>& words) {
  std::lock_guard<std::mutex> lock(mu_);
  deposited_[rank] = number;
  Exchange& exchange = exchanges_[number];
  if (exchange.arrived++ == 0) {
    exchange.words = words;
  } else {
    for (size_t i = 0; i < words.size() && i < exchange.words.size(); ++i) {
      exchange.words[i] &= words[i];
    }
  }
}

bool InProcessLockHub::Completed(uint64_t number, std::vector<uint64_t>* words) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = exchanges_.find(number);
  if (it == exchanges_.end() || it->second.arrived < size_) return false;
  *words = it->second.words;
  if (++it->second.read == size_) exchanges_.erase(it);
  return true;
}

void InProcessLockHub::BreakAfter(int rank, uint64_t number) {
  std::lock_guard<std::mutex> lock(mu_);
  broken_after_[rank] = number;
}

bool InProcessLockHub::Broken(int rank, uint64_t next) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = broken_after_.find(rank);
  return it != broken_after_.end() && next > it->second;
}

std::vector<int> InProcessLockHub::NotDeposited(int rank, uint64_t number) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (r != rank && deposited_[r] < number) ranks.push_back(r);
  }
  return ranks;
}

void InProcessLockHub::Nudge(int from, uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int r = 0; r < size_; ++r) {
    if (r != from) nudges_[r] = std::max(nudges_[r], sequence);
  }
}

uint64_t InProcessLockHub::TakeNudges(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(nudges_[rank], 0);
}

InProcessHub::InProcessHub(int size)
    : size_(size), slots_(size), delays_(size, std::chrono::microseconds(0)) {}

std::unique_ptr<ControlChannel> InProcessHub::Channel(int rank) {
  return std::make_unique<InProcessChannel>(this, rank);
}

void InProcessHub::HoldBack(int rank, std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  delays_[rank] = delay;
}

std::vector<std::string> InProcessHub::Exchange(int rank, std::string mine) {
  std::chrono::microseconds delay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    delay = delays_[rank];
  }
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  std::unique_lock<std::mutex> lock(mu_);
  slots_[rank] = std::move(mine);
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    result_ = slots_;
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return result_;
  }
  // The next exchange cannot complete until this rank joins it, so result_ is stable here.
  cv_.wait(lock, [&] { return generation_ != generation; });
  return result_;
}

}  // namespace gradsync
