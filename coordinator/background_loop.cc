#include "coordinator/background_loop.h"

#include <algorithm>
#include <cctype>
#include <chrono>

#include "coordinator/mpi_control_channel.h"
#include "ops/mpi/mpi_data_plane.h"
#include "runtime/logging.h"

namespace gradsync {

namespace {

constexpr std::chrono::nanoseconds kFirstBackoff = std::chrono::microseconds(20);

}  // namespace

BackgroundLoop::BackgroundLoop(const Config& config, const MpiContext& mpi, TensorQueue* queue,
                               Timeline* timeline)
    : config_(config),
      fusion_{config.fusion_threshold_bytes, config.inplace_threshold_bytes},
      rank_(mpi.rank()),
      queue_(queue),
      channel_(std::make_unique<MpiControlChannel>(mpi.control_comm())),
      timeline_(timeline),
      negotiator_(std::make_unique<Negotiator>(channel_.get(), config, nullptr, timeline)),
      host_plane_(std::make_unique<MpiDataPlane>(mpi.data_comm(), timeline)) {}

BackgroundLoop::~BackgroundLoop() {
  if (thread_.joinable()) Shutdown();
}

void BackgroundLoop::Start() {
  thread_ = std::thread([this] { Run(); });
}

void BackgroundLoop::Shutdown() {
  shutdown_requested_ = true;
  queue_->Wake();
  if (thread_.joinable()) thread_.join();
}

void BackgroundLoop::Run() {
  while (RunOneCycle()) {
  }
}

std::chrono::nanoseconds BackgroundLoop::NextWait() const {
  const auto cycle_time = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
  if (held_ == 0) return cycle_time;  // idle: a push wakes us early
  // Work is waiting on other ranks. Go again at once while cycles make progress (the control
  // collective itself is the rendezvous), and back off towards the cycle time while they do not,
  // so a rank waiting on a stalled peer sleeps.
  if (unproductive_cycles_ == 0) return std::chrono::nanoseconds(0);
  const auto backoff = kFirstBackoff * (1 << std::min(unproductive_cycles_ - 1, 16));
  return std::min<std::chrono::nanoseconds>(backoff, cycle_time);
}

bool BackgroundLoop::RunOneCycle() {
  queue_->WaitForWork(NextWait());
  CycleOutcome outcome;
  const Status negotiated =
      negotiator_->RunCycle(TakeFreshEntries(), shutdown_requested_.load(), &outcome);
  if (!negotiated.ok()) {
    Log().error("negotiation failed, shutting down: {}", negotiated.ToString());
    FailEverything(negotiated);
    return false;
  }
  if (timeline_->active()) MarkNegotiated(outcome);
  unproductive_cycles_ = outcome.responses.empty() ? std::min(unproductive_cycles_ + 1, 64) : 0;
  const Status executed = Execute(outcome);
  if (!executed.ok()) {
    FailEverything(executed);
    return false;
  }
  if (outcome.shutdown) {
    FailEverything(Status::Shutdown("gradsync was shut down (shutdown() was called on a rank)"));
    return false;
  }
  return true;
}

std::vector<TensorEntry*> BackgroundLoop::TakeFreshEntries() {
  std::vector<TensorEntry*> entries = queue_->Drain();
  if ((held_ > 0 || !entries.empty()) && timeline_->active()) {
    timeline_->CycleMark();
    for (const TensorEntry* entry : entries) {
      timeline_->ActivityEnd(entry->name);  // the QUEUE activity the enqueue started
      std::string label = OpTypeName(entry->op);
      for (char& c : label) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      timeline_->NegotiateStart(entry->name, label);  // NEGOTIATE_ALLREDUCE, ...
    }
  }
  held_ += entries.size();
  return entries;
}

void BackgroundLoop::MarkNegotiated(const CycleOutcome& outcome) {
  for (size_t i = 0; i < outcome.responses.size(); ++i) {
    if (outcome.entries[i] != nullptr) timeline_->NegotiateEnd(outcome.entries[i]->name);
  }
}

Status BackgroundLoop::Execute(const CycleOutcome& outcome) {
  const std::vector<ResponsePtr>& responses = outcome.responses;
  const std::vector<TensorEntry*>& entries = outcome.entries;
  // A fatal response comes last: what was agreed before it still runs (the planner skips the fatal
  // one), then everything fails.
  Status fatal;
  if (!responses.empty() && responses.back()->type == ResponseType::kStallShutdown) {
    fatal = Status::Stalled(responses.back()->error);
  }
  for (size_t i = 0; i < responses.size(); ++i) {
    if (entries[i] == nullptr && responses[i]->type != ResponseType::kStallShutdown) {
      return Status::Internal("rank " + std::to_string(rank_) + " was told to run tensor '" +
                              responses[i]->name + "' that it never submitted");
    }
    if (responses[i]->type == ResponseType::kError) {
      Complete({entries[i]}, Status::Mismatch(responses[i]->error));
    }
  }
  std::vector<TensorEntry*> members;
  for (const Bucket& bucket : PlanFusion(responses, fusion_)) {
    members.clear();
    for (size_t i : bucket.responses) members.push_back(entries[i]);
    Complete(members, ExecuteBucket(responses[bucket.responses.front()], members));
  }
  return fatal;
}

Status BackgroundLoop::ExecuteBucket(const ResponsePtr& response,
                                     const std::vector<TensorEntry*>& members) {
  const Response& first = *response;
  TensorEntry* first_entry = members.front();
  DataPlane* plane = PlaneFor(first.device);
  if (plane == nullptr && first.type != ResponseType::kBarrier) {
    return Status::Unsupported("no data plane for " + DeviceName(first.device) + " tensors");
  }
  switch (first.type) {
    case ResponseType::kAllreduce:
      return plane->Allreduce(members,
                              {first.dtype, first.reduce_op, first.prescale, first.postscale});
    case ResponseType::kAllgather:
      return plane->Allgather(first_entry, first.first_dims);
    case ResponseType::kBroadcast:
      return plane->Broadcast(first_entry, first.root);
    case ResponseType::kReducescatter:
      return plane->Reducescatter(members,
                                  {first.dtype, first.reduce_op, first.prescale, first.postscale});
    case ResponseType::kAlltoall:
      return plane->Alltoall(first_entry);
    case ResponseType::kBarrier:
      // Negotiation already proved every rank reached the barrier.
      return Status::OK();
    default:
      return Status::Internal("unplannable response type for '" + first.name + "'");
  }
}

DataPlane* BackgroundLoop::PlaneFor(const Device& device) {
  return device.kind == DeviceKind::kCpu ? host_plane_.get() : nullptr;
}

void BackgroundLoop::Complete(const std::vector<TensorEntry*>& members, const Status& status) {
  // Names are released first so a caller woken by its handle may reuse the name at once.
  completing_.clear();
  for (TensorEntry* entry : members) completing_.push_back(std::move(entry->state));
  queue_->Release(members);
  held_ -= members.size();
  for (const auto& state : completing_) state->RunCallback(status);
  for (const auto& state : completing_) state->Record(status);
  for (const auto& state : completing_) state->Announce();
  completing_.clear();
}

void BackgroundLoop::FailEverything(const Status& reason) {
  queue_->Close(reason);
  TakeFreshEntries();
  Complete(queue_->InFlight(), reason);
}

}  // namespace gradsync
