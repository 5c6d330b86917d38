#include "test/unit/in_process_channel.h"

#include <cstring>
#include <thread>

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

}  // namespace

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
