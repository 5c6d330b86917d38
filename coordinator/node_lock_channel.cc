#include "coordinator/node_lock_channel.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "runtime/mpi_context.h"

namespace gradsync {
namespace {

// One page per rank holds a slot; a node with more ranks than this exchanges through MPI.
constexpr int kMaxSharedRanks = 256;
constexpr size_t kSlotBytes = 4096;

}  // namespace

// Atomics in memory that other processes map: they must need no lock of this process's own.
static_assert(std::atomic<uint64_t>::is_always_lock_free, "a lock-free 64-bit atomic is needed");

struct NodeLockChannel::Slot {
  std::atomic<uint64_t> published;  // the last exchange whose words this rank has written
  std::atomic<uint64_t> nudge;      // the highest sequence this rank has nudged about
  uint64_t words[2][kMaxWords];     // exchange n's in words[n % 2]
};

static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t), "slots are laid out by hand");

NodeLockChannel::NodeLockChannel(MPI_Comm control, bool shared_memory)
    : control_(control), shared_memory_allowed_(shared_memory), mpi_(control) {}

NodeLockChannel::~NodeLockChannel() {
  memory_.reset();
  if (node_comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&node_comm_);
}

NodeLockChannel::Slot* NodeLockChannel::SlotOf(int rank) const {
  static_assert(sizeof(Slot) <= kSlotBytes, "a slot fits its rank's region");
  return reinterpret_cast<Slot*>(memory_->Region(rank));
}

Status NodeLockChannel::Open() {
  if (decided_) return memory_ != nullptr ? Status::OK() : mpi_.Open();
  if (shared_memory_allowed_ && mpi_.size() > 1) {
    GRADSYNC_MPI_CALL(MPI_Comm_dup(control_, &node_comm_));
    auto memory = std::make_unique<NodeSharedMemory>(node_comm_, kSlotBytes, kMaxSharedRanks);
    bool usable = false;
    GRADSYNC_RETURN_IF_ERROR(memory->Prepare(kSlotBytes, &usable));
    if (usable) {
      memory_ = std::move(memory);
      // The segment starts zeroed (a fresh file): nothing published, no nudge.
      seen_nudges_.assign(static_cast<size_t>(size()), 0);
      decided_ = true;
      return Status::OK();
    }
    memory.reset();
    GRADSYNC_MPI_CALL(MPI_Comm_free(&node_comm_));
  }
  GRADSYNC_RETURN_IF_ERROR(mpi_.Open());
  decided_ = true;
  return Status::OK();
}

Status NodeLockChannel::StartAnd(const std::vector<uint64_t>& words) {
  if (memory_ == nullptr) return mpi_.StartAnd(words);
  if (in_flight_) return Status::Internal("locked schedule: two exchanges");
  if (words.size() > static_cast<size_t>(kMaxWords)) {
    return Status::Internal("locked schedule: an exchange of " + std::to_string(words.size()) +
                            " words, more than shared memory carries");
  }
  ++sequence_;
  Slot* mine = SlotOf(rank());
  std::copy(words.begin(), words.end(), mine->words[sequence_ % 2]);
  mine->published.store(sequence_, std::memory_order_release);
  word_count_ = words.size();
  in_flight_ = true;
  return Status::OK();
}

Status NodeLockChannel::TestAnd(bool* done, std::vector<uint64_t>* words) {
  if (memory_ == nullptr) return mpi_.TestAnd(done, words);
  *done = false;
  if (!in_flight_) return Status::Internal("locked schedule: no exchange in flight");
  for (int r = 0; r < size(); ++r) {
    if (SlotOf(r)->published.load(std::memory_order_acquire) < sequence_) return Status::OK();
  }
  words->assign(word_count_, ~uint64_t{0});
  for (int r = 0; r < size(); ++r) {
    const uint64_t* theirs = SlotOf(r)->words[sequence_ % 2];
    for (size_t w = 0; w < word_count_; ++w) (*words)[w] &= theirs[w];
  }
  in_flight_ = false;
  *done = true;
  return Status::OK();
}

Status NodeLockChannel::Nudge(uint64_t sequence) {
  if (memory_ == nullptr) return mpi_.Nudge(sequence);
  std::atomic<uint64_t>& nudge = SlotOf(rank())->nudge;
  if (sequence > nudge.load(std::memory_order_relaxed)) {
    nudge.store(sequence, std::memory_order_release);
  }
  return Status::OK();
}

std::vector<int> NodeLockChannel::NotArrived(uint64_t sequence) const {
  if (memory_ == nullptr) return mpi_.NotArrived(sequence);
  std::vector<int> ranks;
  for (int r = 0; r < size(); ++r) {
    if (r != rank() && SlotOf(r)->published.load(std::memory_order_acquire) < sequence) {
      ranks.push_back(r);
    }
  }
  return ranks;
}

Status NodeLockChannel::TakeNudges(uint64_t* highest) {
  if (memory_ == nullptr) return mpi_.TakeNudges(highest);
  *highest = 0;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    const uint64_t nudge = SlotOf(r)->nudge.load(std::memory_order_acquire);
    if (nudge > seen_nudges_[static_cast<size_t>(r)]) {
      seen_nudges_[static_cast<size_t>(r)] = nudge;
      *highest = std::max(*highest, nudge);
    }
  }
  return Status::OK();
}

}  // namespace gradsync
