#include "runtime/caller_lanes.h"

#include <algorithm>

#include "runtime/mpi_context.h"

namespace gradsync {

void ReleaseLaneComm(CallerLane* lane) {
  MPI_Comm comm = lane->comm.exchange(MPI_COMM_NULL);
  if (comm != MPI_COMM_NULL && MpiUsable()) MPI_Comm_free(&comm);
}

void CallerLaneTable::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  for (CallerLane* lane : lanes_) ReleaseLaneComm(lane);
  lanes_.clear();
  count_.store(0, std::memory_order_relaxed);
}

void CallerLaneTable::Add(CallerLane* lane) {
  std::lock_guard<std::mutex> lock(mu_);
  lanes_.push_back(lane);
  count_.store(lanes_.size(), std::memory_order_relaxed);
}

void CallerLaneTable::Remove(CallerLane* lane) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(lanes_.begin(), lanes_.end(), lane);
  if (it == lanes_.end()) return;
  lanes_.erase(it);
  count_.store(lanes_.size(), std::memory_order_relaxed);
  ReleaseLaneComm(lane);
}

void CallerLaneTable::WithNewest(const std::string& name,
                                 const std::function<void(CallerLane*)>& use) const {
  if (empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lanes_.rbegin(); it != lanes_.rend(); ++it) {
    if ((*it)->name == name) {
      use(*it);
      return;
    }
  }
}

void CallerLaneTable::ForEach(const std::function<void(CallerLane*)>& visit) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (CallerLane* lane : lanes_) visit(lane);
}

}  // namespace gradsync
