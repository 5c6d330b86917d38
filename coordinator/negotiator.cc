#include "coordinator/negotiator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <unordered_set>
#include <utility>

#include "coordinator/wire_format.h"
#include "runtime/generated_name.h"
#include "runtime/logging.h"
#include "runtime/steady_seconds.h"

namespace gradsync {

namespace {

size_t BitWords(size_t bits) { return (bits + 63) / 64; }
bool TestBit(const std::vector<uint64_t>& words, size_t base, size_t bit) {
  return (words[base + bit / 64] >> (bit % 64)) & 1u;
}
void SetBit(std::vector<uint64_t>* words, size_t base, size_t bit) {
  (*words)[base + bit / 64] |= uint64_t{1} << (bit % 64);
}
void ClearBit(std::vector<uint64_t>* words, size_t base, size_t bit) {
  (*words)[base + bit / 64] &= ~(uint64_t{1} << (bit % 64));
}

Response FatalResponse(std::string message) {
  Response r;
  r.type = ResponseType::kStallShutdown;
  r.error = std::move(message);
  return r;
}

}  // namespace

Negotiator::Negotiator(ControlChannel* channel, const Config& config, Clock clock,
                       Timeline* timeline, std::vector<int> rank_labels, int32_t set_id)
    : channel_(channel),
      timeline_(timeline),
      config_(config),
      clock_(clock ? std::move(clock) : Clock(SteadySeconds)),
      rank_(channel->rank()),
      size_(channel->size()),
      cache_(static_cast<size_t>(config.cache_capacity)),
      rank_labels_(std::move(rank_labels)) {
  if (rank_ == 0) {
    table_ = std::make_unique<ReadinessTable>(size_, rank_labels_);
    stall_ = std::make_unique<StallInspector>(config.stall_warning_seconds,
                                              config.stall_shutdown_seconds, set_id);
  }
}

Status Negotiator::RunCycle(const std::vector<TensorEntry*>& fresh, bool want_shutdown,
                            CycleOutcome* out, bool want_lock) {
  *out = CycleOutcome();
  const double now = clock_();
  cached_.resize(cache_.num_bits());
  cached_bits_.resize(BitWords(cache_.num_bits()));
  // Before the fresh entries look up their bits: last cycle's full round may have given the bit
  // of an entry this rank still holds to another name, which may be among them.
  if (cache_changed_) DemoteStale();
  std::vector<uint32_t> invalid;
  AddFresh(fresh, now, &invalid);
  // Before any response retires the join: a join enqueued this cycle may already let the others'
  // tensors run in this cycle's full round.
  out->joined = joins_pending_ > 0;
  const bool has_uncached = RefreshCachedState(now, &invalid);

  // Cached entries, and entries not yet sent through a full round, are this rank's alone (no rank
  // has been told of them), so a lock may take them over; a sent entry may be in rank 0's table.
  const bool lockable = want_lock && invalid.empty() && LockMayTakePending();
  std::vector<uint64_t> words = BuildBitVector(want_shutdown, lockable, has_uncached, invalid, now);
  GRADSYNC_RETURN_IF_ERROR(channel_->AllreduceAnd(&words));

  const uint64_t flags = ~words[0];
  out->shutdown = (flags & kFlagShutdown) != 0;
  out->someone_joined = (flags & kFlagJoined) != 0;
  const size_t bit_words = BitWords(cache_.num_bits());
  const bool any_invalid = std::any_of(words.begin() + 1 + bit_words, words.end(),
                                       [](uint64_t w) { return w != ~uint64_t{0}; });
  ApplyInvalidBits(words);
  TakeCachedReady(words, out);
  if ((flags & kFlagJoined) != 0) {
    for (uint32_t bit = 0; bit < cached_.size(); ++bit) {
      if (cached_[bit].entry != nullptr) Demote(bit);
    }
  }
  // Agreed, the entries no rank has sent stay unsent: the lock takes them over (TakeAllPending),
  // or, should the steps not allow it after all, the next cycle's full round sends them.
  out->lock_agreed =
      (flags & (kFlagNoLock | kFlagShutdown | kFlagInspect | kFlagJoined)) == 0 && !any_invalid;
  if (!out->lock_agreed &&
      ((flags & (kFlagUncached | kFlagInspect | kFlagJoined)) != 0 || any_invalid)) {
    out->full_round = true;
    GRADSYNC_RETURN_IF_ERROR(FullRound(now, out));
  }
  return Status::OK();
}

// A plan places an unnamed operation by its number, so one handed over in the same burst as the
// step's cached tensors (a loss averaged with its gradients) may pass to the lock; such a step
// holds one in every cycle, and never locked while any pending entry kept a rank from offering.
bool Negotiator::LockMayTakePending() const {
  for (const auto& [name, p] : pending_) {
    std::string_view stem;
    uint64_t n = 0;
    if (p.state != PendingState::kUncached || !LockedPlanMayHold(ResponseTypeFor(p.entry->op)) ||
        !ParseGeneratedName(p.entry->name, &stem, &n)) {
      return false;
    }
  }
  return true;
}

ResponsePtr Negotiator::CachedResponse(const std::string& name) const {
  return cache_.Find(NameKey(name));
}

void Negotiator::AddFresh(const std::vector<TensorEntry*>& fresh, double now,
                          std::vector<uint32_t>* invalid) {
  for (TensorEntry* entry : fresh) {
    Pending p;
    p.entry = entry;
    p.first_seen = now;
    p.sequence = next_sequence_++;
    if (entry->group_size > 1) ++grouped_pending_;
    if (entry->op == OpType::kJoin) ++joins_pending_;
    uint32_t bit = 0;
    const ResponseCache::Lookup lookup = cache_.Find(entry->key(), FieldsOf(*entry, rank_), &bit);
    bool duplicate = false;
    if (lookup == ResponseCache::Lookup::kHit) {
      duplicate = cached_[bit].entry != nullptr;
      if (!duplicate) {
        HoldCached(bit, p);
        continue;
      }
    } else if (lookup == ResponseCache::Lookup::kMismatch) {
      // Parameters changed since the name was cached: every rank drops the entry and the tensor
      // is negotiated in full, where validation compares all ranks' parameters.
      invalid->push_back(bit);
    }
    if (duplicate || !pending_.Insert(entry->key(), std::move(p))) {
      std::fprintf(stderr, "gradsync: internal error: tensor '%s' negotiated twice\n",
                   entry->name.c_str());
      std::abort();
    }
  }
  // A group is enqueued atomically, so all of it is fresh in the same cycle.
  if (grouped_pending_ > 0) KeepGroupsTogether();
}

void Negotiator::HoldCached(uint32_t bit, const Pending& p) {
  cached_[bit] = p;
  SetBit(&cached_bits_, 0, bit);
  // Later entries are never older, so the first one held bounds them all.
  if (cached_count_++ == 0) cached_oldest_ = p.first_seen;
}

Negotiator::Pending Negotiator::TakeCached(uint32_t bit) {
  if (bit >= cached_.size() || cached_[bit].entry == nullptr) return {};
  const Pending held = std::exchange(cached_[bit], Pending());
  ClearBit(&cached_bits_, 0, bit);
  --cached_count_;
  return held;
}

void Negotiator::Demote(uint32_t bit) {
  Pending held = TakeCached(bit);
  if (held.entry == nullptr) return;
  const NameKey key = held.entry->key();
  pending_.Insert(key, std::move(held));
}

void Negotiator::DemoteStale() {
  cache_changed_ = false;
  for (uint32_t bit = 0; bit < cached_.size(); ++bit) {
    const TensorEntry* entry = cached_[bit].entry;
    if (entry != nullptr && (!cache_.Contains(bit) || cache_.KeyOf(bit) != entry->key())) {
      Demote(bit);
    }
  }
}

// A group runs in one cycle: through the cache only if every member is cached, otherwise every
// member goes through the full round, where rank 0 holds them until the whole group is ready. The
// state of a member's siblings is the same on every rank (caches are identical), so every rank
// reaches the same decision.
void Negotiator::KeepGroupsTogether() {
  std::unordered_set<std::string_view> split;
  for (const auto& [name, p] : pending_) {
    if (p.entry->group_size > 1) split.insert(p.entry->group);
  }
  if (split.empty()) return;
  for (uint32_t bit = 0; bit < cached_.size(); ++bit) {
    const TensorEntry* entry = cached_[bit].entry;
    if (entry != nullptr && entry->group_size > 1 && split.count(entry->group) != 0) Demote(bit);
  }
}

bool Negotiator::RefreshCachedState(double now, std::vector<uint32_t>* invalid) {
  if (cached_count_ > 0 && now - cached_oldest_ >= config_.stall_warning_seconds) {
    // Cached tensors never reach rank 0's table; invalidating a long-waiting one sends it there,
    // so the stall inspector can name the ranks that are missing it.
    double oldest = std::numeric_limits<double>::infinity();
    for (uint32_t bit = 0; bit < cached_.size(); ++bit) {
      if (cached_[bit].entry == nullptr) continue;
      if (now - cached_[bit].first_seen >= config_.stall_warning_seconds) {
        invalid->push_back(bit);
        Demote(bit);
      } else {
        oldest = std::min(oldest, cached_[bit].first_seen);
      }
    }
    cached_oldest_ = oldest;
  }
  if (grouped_pending_ > 0) KeepGroupsTogether();
  return std::any_of(pending_.begin(), pending_.end(),
                     [](const auto& item) { return item.value.state == PendingState::kUncached; });
}

std::vector<uint64_t> Negotiator::BuildBitVector(bool want_shutdown, bool want_lock,
                                                 bool has_uncached,
                                                 const std::vector<uint32_t>& invalid,
                                                 double now) const {
  const size_t bit_words = BitWords(cache_.num_bits());
  std::vector<uint64_t> words(1 + 2 * bit_words, ~uint64_t{0});
  uint64_t flags = 0;
  if (want_shutdown) flags |= kFlagShutdown;
  if (!want_lock) flags |= kFlagNoLock;
  if (has_uncached) flags |= kFlagUncached;
  if (joins_pending_ > 0) flags |= kFlagJoined;
  if (rank_ == 0 && stall_->InspectionDue(*table_, now)) flags |= kFlagInspect;
  words[0] = ~flags;
  std::copy(cached_bits_.begin(), cached_bits_.end(), words.begin() + 1);
  for (uint32_t bit : invalid) ClearBit(&words, 1 + bit_words, bit);
  return words;
}

void Negotiator::ApplyInvalidBits(const std::vector<uint64_t>& words) {
  const size_t bits = cache_.num_bits();
  const size_t invalid_base = 1 + BitWords(bits);
  std::vector<uint32_t> erased;
  for (size_t bit = 0; bit < bits; ++bit) {
    if (!TestBit(words, invalid_base, bit)) erased.push_back(static_cast<uint32_t>(bit));
  }
  if (erased.empty()) return;
  // Invalidating one member of a group invalidates the whole group, on every rank alike, so that no
  // rank can run part of a group from the cache while the rest goes through the full round.
  const size_t invalidated = erased.size();
  for (size_t i = 0; i < invalidated; ++i) {
    if (!cache_.Contains(erased[i])) continue;
    const Response& response = *cache_.Get(erased[i]);
    if (response.group_size > 1) cache_.AppendGroupBits(response.group, &erased);
  }
  for (uint32_t bit : erased) {
    cache_.Erase(bit);
    Demote(bit);
  }
}

void Negotiator::TakeCachedReady(const std::vector<uint64_t>& words, CycleOutcome* out) {
  const size_t bits = cache_.num_bits();
  size_t ready_count = 0;
  for (size_t w = 0; w < BitWords(bits); ++w) ready_count += __builtin_popcountll(words[1 + w]);
  out->entries.reserve(out->entries.size() + ready_count);
  out->responses.reserve(out->responses.size() + ready_count);
  for (size_t w = 0; w < BitWords(bits); ++w) {
    uint64_t ready = words[1 + w];
    while (ready != 0) {
      const uint32_t bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(ready));
      ready &= ready - 1;
      if (!cache_.Contains(bit)) continue;
      cache_.Touch(bit);
      out->entries.push_back(RetireCached(bit));
      out->responses.push_back(cache_.Get(bit).get());
      ++out->cache_hits;
    }
  }
}

Status Negotiator::FullRound(double now, CycleOutcome* out) {
  std::vector<Pending*> to_send;
  for (auto& [name, p] : pending_) {
    if (p.state == PendingState::kUncached) to_send.push_back(&p);
  }
  std::sort(to_send.begin(), to_send.end(),
            [](const Pending* a, const Pending* b) { return a->sequence < b->sequence; });
  RequestList mine;
  mine.requests.reserve(to_send.size());
  mine.requests.resize(to_send.size());
  for (size_t i = 0; i < to_send.size(); ++i) {
    to_send[i]->state = PendingState::kSent;
    RequestFromEntry(*to_send[i]->entry, rank_, now - to_send[i]->first_seen, &mine.requests[i]);
  }

  std::vector<std::string> gathered;
  GRADSYNC_RETURN_IF_ERROR(channel_->Gather(SerializeRequestList(mine), &gathered));
  std::string bytes;
  if (rank_ == 0) {
    ResponseList list;
    CoordinatorRespond(gathered, now, &list);
    bytes = SerializeResponseList(list);
  }
  GRADSYNC_RETURN_IF_ERROR(channel_->Broadcast(&bytes));
  ResponseList list;
  GRADSYNC_RETURN_IF_ERROR(ParseResponseList(bytes.data(), bytes.size(), &list));

  // Putting a response may evict a cached one that this outcome already points to: pin those first.
  // Full rounds are rare once the cache is warm, so the copies cost little.
  if (!list.responses.empty()) {
    for (const Response* taken : out->responses) out->owned.push_back(cache_.Share(taken));
  }
  for (Response& parsed : list.responses) {
    auto response = std::make_shared<const Response>(std::move(parsed));
    TensorEntry* entry = nullptr;
    if (response->type != ResponseType::kStallShutdown) {
      cache_.Put(response);
      cache_changed_ = true;
      entry = Retire(NameKey(response->name));
    }
    out->entries.push_back(entry);
    out->responses.push_back(response.get());
    out->owned.push_back(std::move(response));
  }
  return Status::OK();
}

void Negotiator::CoordinatorRespond(const std::vector<std::string>& gathered, double now,
                                    ResponseList* responses) {
  std::vector<std::string> ready;
  for (int r = 0; r < size_; ++r) {
    RequestList list;
    const Status parsed = ParseRequestList(gathered[r].data(), gathered[r].size(), &list);
    if (!parsed.ok()) {
      // Every rank must hear about it, so it travels as a fatal response, not a local error.
      const int label = rank_labels_.empty() ? r : rank_labels_[r];
      responses->responses = {FatalResponse("corrupt negotiation message from rank " +
                                            std::to_string(label) + ": " + parsed.message())};
      return;
    }
    for (Request& request : list.requests) {
      request.rank = r;  // the sender is who the transport says, whatever the bytes claim
      if (timeline_ != nullptr && timeline_->active())
        timeline_->RankReady(request.name, rank_labels_.empty() ? r : rank_labels_[r]);
      table_->Add(request, now);
    }
  }
  table_->TakeRunnable(&ready);
  for (const std::string& name : ready) responses->responses.push_back(table_->TakeReady(name));
  if (stall_->InspectionDue(*table_, now)) {
    const Status stalled = stall_->Inspect(*table_, now);
    if (!stalled.ok()) {
      Log().error("{}", stalled.message());
      responses->responses.push_back(FatalResponse(stalled.message()));
      // Reported once; every rank stops now.
      table_ = std::make_unique<ReadinessTable>(size_, rank_labels_);
    }
  }
}

TensorEntry* Negotiator::Retire(const NameKey& name) {
  std::optional<Pending> retired = pending_.Take(name);
  if (!retired) return nullptr;
  Forget(*retired->entry);
  return retired->entry;
}

TensorEntry* Negotiator::RetireCached(uint32_t bit) {
  TensorEntry* entry = TakeCached(bit).entry;
  if (entry != nullptr) Forget(*entry);
  return entry;
}

void Negotiator::Forget(const TensorEntry& entry) {
  if (entry.group_size > 1) --grouped_pending_;
  if (entry.op == OpType::kJoin) --joins_pending_;
}

std::vector<TensorEntry*> Negotiator::TakeAllPending() {
  // In the order this rank submitted them: a lock places an unnamed operation only after what its
  // plan puts ahead of it.
  std::vector<std::pair<uint64_t, TensorEntry*>> held;
  for (const auto& [name, p] : pending_) held.emplace_back(p.sequence, p.entry);
  for (const auto& [sequence, entry] : held) Retire(entry->key());
  for (uint32_t bit = 0; bit < cached_.size(); ++bit) {
    const uint64_t sequence = cached_[bit].sequence;
    if (TensorEntry* entry = RetireCached(bit)) held.emplace_back(sequence, entry);
  }
  std::sort(held.begin(), held.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<TensorEntry*> entries;
  entries.reserve(held.size());
  for (const auto& [sequence, entry] : held) entries.push_back(entry);
  return entries;
}

}  // namespace gradsync
