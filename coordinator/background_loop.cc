#include "coordinator/background_loop.h"

#include <algorithm>
#include <chrono>

#include "coordinator/mpi_control_channel.h"
#include "ops/mpi/mpi_data_plane.h"
#include "runtime/logging.h"

namespace gradsync {

namespace {

constexpr std::chrono::nanoseconds kFirstBackoff = std::chrono::microseconds(20);

}  // namespace

BackgroundLoop::BackgroundLoop(const Config& config, const MpiContext& mpi, TensorQueue* queue)
    : config_(config),
      fusion_{config.fusion_threshold_bytes, config.inplace_threshold_bytes},
      rank_(mpi.rank()),
      queue_(queue),
      channel_(std::make_unique<MpiControlChannel>(mpi.control_comm())),
      negotiator_(std::make_unique<Negotiator>(channel_.get(), config)),
      host_plane_(std::make_unique<MpiDataPlane>(mpi.data_comm())) {}

BackgroundLoop::~BackgroundLoop() {
  if (thread_.joinable()) Shutdown();
}

void BackgroundLoop::Start() { thread_ = std::thread([this] { Run(); }); }

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
  if (entries_.empty()) return cycle_time;  // idle: a push wakes us early
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
  unproductive_cycles_ = outcome.responses.empty() ? unproductive_cycles_ + 1 : 0;
  const Status executed = Execute(outcome.responses);
  if (!executed.ok()) {
    FailEverything(executed);
    return false;
  }
  if (outcome.shutdown) {
    FailEverything(Status::Shutdown("gradsync was shut down before this operation completed"));
    return false;
  }
  return true;
}

std::vector<Request> BackgroundLoop::TakeFreshEntries() {
  std::vector<std::unique_ptr<TensorEntry>> drained = queue_->Drain();
  std::vector<Request> fresh;
  fresh.reserve(drained.size());
  for (auto& entry : drained) {
    fresh.push_back(RequestFromEntry(*entry, rank_, 0.0));
    std::string name = entry->name;
    entries_.emplace(std::move(name), std::move(entry));
  }
  return fresh;
}

Status BackgroundLoop::Execute(const std::vector<Response>& responses) {
  for (const Response& r : responses) {
    if (r.type == ResponseType::kStallShutdown) return Status::Stalled(r.error);
    if (Lookup(r.name) == nullptr) {
      return Status::Internal("rank " + std::to_string(rank_) + " was told to run tensor '" +
                              r.name + "' that it never submitted");
    }
    if (r.type == ResponseType::kError) Complete(r.name, Status::Mismatch(r.error));
  }
  for (const Bucket& bucket : PlanFusion(responses, fusion_)) {
    const Status status = ExecuteBucket(responses, bucket);
    for (size_t i : bucket.responses) Complete(responses[i].name, status);
  }
  return Status::OK();
}

Status BackgroundLoop::ExecuteBucket(const std::vector<Response>& responses, const Bucket& bucket) {
  const Response& first = responses[bucket.responses.front()];
  DataPlane* plane = PlaneFor(first.device);
  if (plane == nullptr && first.type != ResponseType::kBarrier) {
    return Status::Unsupported("no data plane for " + DeviceName(first.device) + " tensors");
  }
  switch (first.type) {
    case ResponseType::kAllreduce: {
      std::vector<TensorEntry*> entries;
      entries.reserve(bucket.responses.size());
      for (size_t i : bucket.responses) entries.push_back(Lookup(responses[i].name));
      return plane->Allreduce(entries, {first.dtype, first.reduce_op, first.prescale,
                                        first.postscale});
    }
    case ResponseType::kAllgather:
      return plane->Allgather(Lookup(first.name), first.first_dims);
    case ResponseType::kBroadcast:
      return plane->Broadcast(Lookup(first.name), first.root);
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

TensorEntry* BackgroundLoop::Lookup(const std::string& name) {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.get();
}

void BackgroundLoop::Complete(const std::string& name, const Status& status) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  std::shared_ptr<OpState> state = std::move(it->second->state);
  entries_.erase(it);
  queue_->Release(name);
  state->Complete(status);
}

void BackgroundLoop::FailEverything(const Status& reason) {
  queue_->Close(reason);
  TakeFreshEntries();
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) names.push_back(name);
  for (const std::string& name : names) Complete(name, reason);
}

}  // namespace gradsync
