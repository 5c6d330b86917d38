#include "coordinator/locked_schedule.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "runtime/cpu_relax.h"
#include "runtime/logging.h"
#include "runtime/name_key.h"
#include "runtime/steady_seconds.h"

namespace gradsync {

namespace {

// Word 0 of an exchange holds flags, stored inverted so that the AND across ranks yields their OR;
// words 1 and 2 hold the bucket's fingerprint and its complement, so that the AND shows whether
// every rank sent the same one; word 3 has bit i set when the i-th bucket from the cursor is full
// here, so that the AND's low run of ones is the buckets every rank can run now.
constexpr uint64_t kRelease = 1;
constexpr size_t kExchangeWords = 4;
// Mixed with the name of a step's tensor that follows a wait, into the step's fingerprint.
constexpr uint64_t kCutHere = 0x6375742068657265ull;
// As MpiControlChannel polls a negotiation round before it sleeps.
constexpr double kPollSeconds = 200e-6;
// A microsecond or so of pauses between looks at the exchange.
constexpr int kPausesPerPoll = 64;

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 32);
}

uint64_t MixDouble(uint64_t h, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return Mix(h, bits);
}

// Everything ParametersMatch compares, as one number.
uint64_t ParameterHash(const Response& r) {
  uint64_t h = Mix(static_cast<uint64_t>(r.type), static_cast<uint64_t>(r.dtype));
  h = Mix(h, static_cast<uint64_t>(r.reduce_op));
  h = Mix(h, static_cast<uint64_t>(r.device.kind) << 32 | static_cast<uint32_t>(r.device.index));
  h = MixDouble(MixDouble(h, r.prescale), r.postscale);
  h = Mix(Mix(h, static_cast<uint64_t>(r.root)), static_cast<uint64_t>(r.group_size));
  for (int64_t d : r.shape) h = Mix(h, static_cast<uint64_t>(d));
  for (int64_t d : r.first_dims) h = Mix(h, static_cast<uint64_t>(d));
  return Mix(h, GroupKey(r.group, r.name));
}

}  // namespace

LockSettings LockSettings::From(const Config& config) {
  LockSettings s;
  s.enabled = config.locked_schedule;
  s.after_steps = config.lock_after_steps;
  // A stall must still be reported about when the stall settings say: the lock is left (and the
  // stall inspector takes over) within two waits, so a short stall warning shortens the wait.
  s.wait_seconds = std::min(config.lock_wait_ms / 1e3, config.stall_warning_seconds / 2);
  s.stall_warning_seconds = config.stall_warning_seconds;
  s.stall_shutdown_seconds = config.PeerThreadGiveUpSeconds();
  s.longest_step = static_cast<size_t>(std::max<int64_t>(config.cache_capacity, 1));
  s.single_apart = config.caller_launch == CallerLaunch::kSingle;
  return s;
}

LockedSchedule::LockedSchedule(std::unique_ptr<LockChannel> channel, const LockSettings& settings,
                               int32_t set_id, Clock clock)
    : channel_(std::move(channel)),
      settings_(settings),
      set_id_(set_id),
      clock_(clock ? std::move(clock) : Clock(SteadySeconds)) {}

void LockedSchedule::Observe(const CycleOutcome& outcome) {
  if (!settings_.enabled) return;
  for (size_t i = 0; i < outcome.responses.size(); ++i) {
    const Response& r = *outcome.responses[i];
    bool generated = false;
    const uint64_t name_hash = StepKey(r.name, &generated);
    if (!generated && current_.name_hashes.count(name_hash) != 0) CloseStep();
    if (current_.count == current_.names.size()) {
      current_.names.emplace_back();
      current_.waits_before.emplace_back();
    }
    const TensorEntry* entry = outcome.entries[i];
    const uint64_t waits = entry != nullptr ? entry->waits_before : 0;
    // A wait between this tensor and the one before it cuts the plan there. Where this rank's
    // caller waits is its own (another rank may poll instead), so it is kept beside the
    // fingerprint, which every rank must compute alike.
    if (current_.count > 0 && current_.waits_before[current_.count - 1] != waits) {
      current_.cuts += Mix(name_hash, kCutHere);
    }
    current_.waits_before[current_.count] = waits;
    current_.names[current_.count++] = r.name;  // assigning keeps the string's storage
    if (!generated) current_.name_hashes.insert(name_hash);
    current_.fingerprint += Mix(name_hash, ParameterHash(r));  // a sum: free of order
    current_.lockable &=
        LockedPlanMayHold(r.type) && outcome.entries[i] != nullptr && !outcome.joined;
    if (current_.count > settings_.longest_step) {
      current_.lockable = false;  // the same on every rank: the count follows the responses
      CloseStep();
    } else if (current_.count == previous_.count && current_.fingerprint == previous_.fingerprint) {
      CloseStep();
    }
  }
}

void LockedSchedule::CloseStep() {
  if (current_.count == 0) return;
  const bool same = previous_.lockable && current_.count == previous_.count &&
                    current_.fingerprint == previous_.fingerprint;
  streak_ = !current_.lockable ? 0 : same ? streak_ + 1 : 1;
  cut_streak_ = same && current_.cuts == previous_.cuts ? cut_streak_ + 1 : 1;
  std::swap(previous_, current_);
  current_.Restart();
}

bool LockedSchedule::ready() const {
  return settings_.enabled && !locked_ && streak_ >= settings_.after_steps;
}

bool LockedSchedule::WantsToLock() const { return ready() && cut_streak_ >= settings_.after_steps; }

Status LockedSchedule::Lock(const FusionSettings& fusion, const CachedResponse& cached) {
  std::vector<ResponsePtr> order;
  order.reserve(previous_.count);
  for (size_t i = 0; i < previous_.count; ++i) {
    ResponsePtr response = cached(previous_.names[i]);
    // Caches are the same on every rank, so every rank gives up here alike.
    if (response == nullptr || !LockedPlanMayHold(response->type)) {
      streak_ = 0;
      return Status::OK();
    }
    order.push_back(std::move(response));
  }
  // Generated names whose numbers leave gaps were not one loop's: on every rank alike.
  if (!unnamed_.Build(previous_.names, previous_.count)) {
    streak_ = 0;
    return Status::OK();
  }
  buckets_.clear();
  positions_ = NameTable<Position>();
  step_positions_.assign(order.size(), Position());
  plan_fingerprint_ = Mix(static_cast<uint64_t>(set_id_), order.size());
  for (const std::vector<size_t>& planned : PlanBuckets(order, fusion)) {
    PlannedBucket bucket;
    for (size_t i : planned) {
      const Response& r = *order[i];
      const Position position{static_cast<uint32_t>(buckets_.size()),
                              static_cast<uint32_t>(bucket.responses.size())};
      step_positions_[i] = position;
      int64_t unused;
      if (unnamed_.empty() || !unnamed_.Find(r.name, &unused)) {
        positions_.Insert(NameKey(r.name), position);
      }
      plan_fingerprint_ = Mix(Mix(plan_fingerprint_, unnamed_.KeyOf(r.name)), ParameterHash(r));
      bucket.responses.push_back(order[i]);
    }
    bucket.slots.assign(bucket.responses.size(), nullptr);
    bucket.done.assign(bucket.responses.size(), 0);
    plan_fingerprint_ = Mix(plan_fingerprint_, bucket.responses.size());
    buckets_.push_back(std::move(bucket));
  }
  // The step under way (the same on every rank) goes on from where negotiation left it.
  for (size_t i = 0; i < current_.count; ++i) {
    const Position* position = FindPosition(NameKey(current_.names[i]));
    // Not in the plan, or a second unnamed operation in one unnamed place (the step under way is
    // not the plan's): on every rank alike, since every rank observed the same responses.
    if (position == nullptr || buckets_[position->bucket].done[position->index] != 0) {
      streak_ = 0;
      return Status::OK();
    }
    PlannedBucket& bucket = buckets_[position->bucket];
    bucket.done[position->index] = 1;
    ++bucket.done_count;
  }
  GRADSYNC_RETURN_IF_ERROR(channel_->Open());
  locked_ = true;
  cursor_ = buckets_.size() - 1;
  AdvanceCursor();
  held_ = 0;
  last_progress_ = clock_();
  Log().info(
      "process set {} locked its schedule after {} identical steps: {} tensors in {} buckets",
      set_id_, streak_, order.size(), buckets_.size());
  return Status::OK();
}

std::vector<std::vector<size_t>> LockedSchedule::PlanBuckets(const std::vector<ResponsePtr>& order,
                                                             const FusionSettings& fusion) const {
  std::vector<std::vector<size_t>> buckets;
  std::vector<const Response*> run;
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && previous_.waits_before[end] == previous_.waits_before[begin]) {
      ++end;
    }
    run.clear();
    for (size_t i = begin; i < end; ++i) run.push_back(order[i].get());
    for (const Bucket& planned : PlanFusion(run, fusion, /*consecutive=*/true)) {
      buckets.emplace_back();
      for (size_t i : planned.responses) buckets.back().push_back(begin + i);
    }
    begin = end;
  }
  return buckets;
}

size_t LockedSchedule::MissingForNextBucket() const {
  if (!locked_ || in_flight_ || !leave_reason_.empty()) return 0;
  const PlannedBucket& next = buckets_[cursor_];
  return next.responses.size() - next.filled - next.done_count;
}

Status LockedSchedule::RunCycle(const std::vector<TensorEntry*>& fresh, bool release,
                                const std::string& why, LockedCycle* out, bool poll_peers,
                                size_t most_tensors) {
  const double now = clock_();
  most_tensors_ = most_tensors;
  for (TensorEntry* entry : fresh) Place(entry, now);
  if (!deferred_failure_.ok()) return std::exchange(deferred_failure_, Status::OK());
  if (release && leave_reason_.empty()) leave_reason_ = why;
  Status advanced = Advance(out, poll_peers);
  // Buckets every rank agreed on run before this rank fails: the others run them, and their
  // collectives (a host bucket's blocks without a limit) would wait for this rank's for ever.
  if (!advanced.ok() && !out->buckets.empty()) {
    deferred_failure_ = std::move(advanced);
    return Status::OK();
  }
  return advanced;
}

const LockedSchedule::Position* LockedSchedule::FindPosition(const NameKey& key,
                                                             bool* generated) const {
  int64_t slot = -1;
  const bool by_number = !unnamed_.empty() && unnamed_.Find(key.name, &slot);
  if (generated != nullptr) *generated = by_number;
  if (by_number) return slot < 0 ? nullptr : &step_positions_[static_cast<size_t>(slot)];
  return positions_.Find(key);
}

bool LockedSchedule::AheadOfPlan(const Position& position) const {
  for (size_t b = cursor_; b != position.bucket; b = (b + 1) % buckets_.size()) {
    if (!buckets_[b].full()) return true;
  }
  const PlannedBucket& bucket = buckets_[position.bucket];
  for (size_t i = 0; i < position.index; ++i) {
    if (bucket.slots[i] == nullptr && !bucket.done[i]) return true;
  }
  return false;
}

void LockedSchedule::Place(TensorEntry* entry, double now) {
  bool generated = false;
  const Position* position = FindPosition(entry->key(), &generated);
  // An unnamed operation goes where its number puts it, which is where it belongs only if this
  // rank has submitted what comes before it (one more than the steps have would take the next
  // step's place, and wait there for that step's tensors).
  const bool ahead = generated && position != nullptr && AheadOfPlan(*position);
  std::string difference;  // from the plan's parameters, where the slot was free
  if (position != nullptr && !ahead) {
    PlannedBucket& bucket = buckets_[position->bucket];
    const Response& planned = *bucket.responses[position->index];
    TensorEntry*& slot = bucket.slots[position->index];
    RequestFields fields = FieldsOf(*entry, channel_->rank());
    // An unnamed group is known by its first member's name, new at every call as the members'.
    if (generated && entry->group_size != 0 &&
        GroupKey(entry->group, entry->name) == GroupKey(planned.group, planned.name)) {
      fields.group = planned.group;
    }
    if (slot == nullptr && ParametersMatch(planned, fields)) {
      slot = entry;
      if (!bucket.done[position->index]) ++bucket.filled;
      ++held_;
      last_progress_ = now;
      return;
    }
    if (slot == nullptr) difference = ParameterDifference(planned, fields);
  }
  deviations_.push_back(entry);
  if (!leave_reason_.empty()) return;
  const std::string what = OpTypeName(entry->op) + " of '" + entry->name + "'";
  if (entry->op == OpType::kJoin) {
    leave_reason_ = "this rank called join()";
  } else if (position == nullptr) {
    leave_reason_ = "this rank submitted " + what + ", which is not in the locked plan";
  } else if (ahead) {
    leave_reason_ = "this rank submitted " + what +
                    " before the tensors the locked plan puts ahead of it (unnamed operations "
                    "are placed by their order)";
  } else if (difference.empty()) {
    leave_reason_ = "this rank submitted " + what + " again before the locked bucket " +
                    std::to_string(position->bucket) + " holding it ran";
  } else {
    leave_reason_ = "this rank submitted " + what + " with " + difference;
  }
}

Status LockedSchedule::Advance(LockedCycle* out, bool poll_peers) {
  while (locked_) {
    const double now = clock_();
    if (in_flight_) {
      bool done = false;
      GRADSYNC_RETURN_IF_ERROR(channel_->TestAnd(&done, &words_));
      if (done) {
        in_flight_ = false;
        last_progress_ = now;
        Finish(words_, out);
        continue;
      }
      // Peers usually arrive within microseconds of each other: poll a while, keeping the core
      // (a yield can cost a time slice where compute fills the cores), before handing the wait
      // back to the loop's backoff, which sleeps.
      if (poll_peers && now - started_at_ < kPollSeconds) {
        for (int i = 0; i < kPausesPerPoll; ++i) CpuRelax();
        continue;
      }
      return WhileWaiting(now);
    }
    const PlannedBucket& next = buckets_[cursor_];
    const bool full = next.full();
    if (leave_reason_.empty() && !full) {
      // Only a rank that cannot start the next exchange needs to hear that others wait for it.
      uint64_t nudged = 0;
      GRADSYNC_RETURN_IF_ERROR(channel_->TakeNudges(&nudged));
      nudged_ = std::max(nudged_, nudged);
      if (held_ > 0 && now - last_progress_ >= settings_.wait_seconds) {
        leave_reason_ = "locked bucket " + std::to_string(cursor_) + " has waited " +
                        Milliseconds(now - last_progress_) + " on this rank for " +
                        MissingNames(next);
      } else if (nudged_ > exchanges_) {
        leave_reason_ = "another rank has reached locked bucket " + std::to_string(cursor_) +
                        " (to run it, or to leave the lock) and this rank has not";
      }
    }
    if (!leave_reason_.empty() || (full && next.responses.size() <= most_tensors_)) {
      GRADSYNC_RETURN_IF_ERROR(StartExchange(!leave_reason_.empty(), now));
      continue;
    }
    return Status::OK();
  }
  return Status::OK();
}

Status LockedSchedule::StartExchange(bool release, double now) {
  const uint64_t fingerprint = Mix(plan_fingerprint_, cursor_);
  words_.assign(kExchangeWords, 0);
  words_[0] = ~(release ? kRelease : uint64_t{0});
  words_[1] = fingerprint;
  words_[2] = ~fingerprint;
  words_[3] = release ? 0 : FullBuckets();
  GRADSYNC_RETURN_IF_ERROR(channel_->StartAnd(words_));
  in_flight_ = true;
  ++exchanges_;
  started_at_ = now;
  next_nudge_ = now + settings_.wait_seconds;
  next_warning_ = now + std::max(settings_.stall_warning_seconds, 2 * settings_.wait_seconds);
  // A release has nothing to wait for: ranks that hold nothing (and so start no exchange) learn
  // of it at once instead of after a wait.
  if (release) GRADSYNC_RETURN_IF_ERROR(channel_->Nudge(exchanges_));
  return Status::OK();
}

void LockedSchedule::Finish(const std::vector<uint64_t>& words, LockedCycle* out) {
  const bool released = (~words[0] & kRelease) != 0;
  if (words[1] != ~words[2]) {
    Log().error(
        "process set {}: the ranks' locked plans differ at bucket {} (their steps were cut at "
        "different waits, or an internal error); leaving the lock",
        set_id_, cursor_);
    Leave("the ranks' locked plans differ", out);
    return;
  }
  if (released) {
    Leave(leave_reason_.empty() ? "another rank left the lock" : leave_reason_, out);
    return;
  }
  // Every rank that did not release sent at least the cursor's bucket as full.
  const int ready = __builtin_ctzll(~words[3] | (uint64_t{1} << 63));
  for (int i = 0; i < std::max(ready, 1); ++i) EmitBucket(out);
}

uint64_t LockedSchedule::FullBuckets() const {
  uint64_t mask = 1;  // the cursor's bucket: an exchange that does not release starts only then
  const bool cursor_single = buckets_[cursor_].responses.size() == 1;
  for (size_t i = 1; i < 63 && cursor_ + i < buckets_.size(); ++i) {
    const PlannedBucket& bucket = buckets_[cursor_ + i];
    if (bucket.done_count != 0 || !bucket.full()) break;
    if (settings_.single_apart && (bucket.responses.size() == 1) != cursor_single) break;
    mask |= uint64_t{1} << i;
  }
  return mask;
}

void LockedSchedule::EmitBucket(LockedCycle* out) {
  PlannedBucket& bucket = buckets_[cursor_];
  CycleOutcome run;
  // The plan's responses outlive the outcome (only Lock replaces them, in a negotiated cycle), so
  // the outcome points to them without holding them: no reference count moves per tensor.
  if (bucket.done_count == 0) {
    run.entries = bucket.slots;
    std::fill(bucket.slots.begin(), bucket.slots.end(), nullptr);
    run.responses.reserve(bucket.responses.size());
    for (const ResponsePtr& r : bucket.responses) run.responses.push_back(r.get());
  } else {
    for (size_t i = 0; i < bucket.responses.size(); ++i) {
      if (bucket.done[i]) continue;
      run.responses.push_back(bucket.responses[i].get());
      run.entries.push_back(std::exchange(bucket.slots[i], nullptr));
    }
  }
  held_ -= bucket.filled;
  bucket.filled = 0;
  EndFirstStep(&bucket);
  out->buckets.push_back(std::move(run));
  AdvanceCursor();
}

void LockedSchedule::AdvanceCursor() {
  cursor_ = (cursor_ + 1) % buckets_.size();
  // At most once around: a step never runs every bucket before the lock begins.
  for (size_t turns = 0; turns < buckets_.size() &&
                         buckets_[cursor_].done_count == buckets_[cursor_].responses.size();
       ++turns) {
    EndFirstStep(&buckets_[cursor_]);
    cursor_ = (cursor_ + 1) % buckets_.size();
  }
}

void LockedSchedule::EndFirstStep(PlannedBucket* bucket) {
  if (bucket->done_count == 0) return;
  std::fill(bucket->done.begin(), bucket->done.end(), 0);
  bucket->done_count = 0;
  bucket->filled =
      static_cast<size_t>(std::count_if(bucket->slots.begin(), bucket->slots.end(),
                                        [](const TensorEntry* entry) { return entry != nullptr; }));
}

void LockedSchedule::Leave(const std::string& why, LockedCycle* out) {
  out->unlocked = true;
  out->reason = why;
  out->returned = TakeAllHeld();
  Log().info("process set {} left its locked schedule: {}", set_id_, why);
}

std::vector<TensorEntry*> LockedSchedule::TakeAllHeld() {
  std::vector<TensorEntry*> held;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    PlannedBucket& bucket = buckets_[(cursor_ + i) % buckets_.size()];
    for (TensorEntry*& slot : bucket.slots) {
      if (slot != nullptr) held.push_back(slot);
      slot = nullptr;
    }
    bucket.filled = 0;
    std::fill(bucket.done.begin(), bucket.done.end(), 0);
    bucket.done_count = 0;
  }
  held.insert(held.end(), deviations_.begin(), deviations_.end());
  deviations_.clear();
  held_ = 0;
  leave_reason_.clear();
  locked_ = false;
  streak_ = 0;
  cut_streak_ = 0;
  current_.Restart();
  return held;
}

}  // namespace gradsync
