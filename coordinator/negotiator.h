// Negotiator: one rank's side of the negotiation protocol (docs/protocol.md) for one group of
// ranks. Each cycle it takes the requests that became ready locally and returns the responses every
// rank executes, in the same order on every rank.
//
// Owns this rank's pending requests and response cache, and on rank 0 the readiness table and
// stall inspector. RunCycle is collective over the ControlChannel; everything here runs on the
// background thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/control_channel.h"
#include "coordinator/message.h"
#include "coordinator/readiness_table.h"
#include "coordinator/response_cache.h"
#include "coordinator/stall_inspector.h"
#include "runtime/config.h"
#include "runtime/name_table.h"
#include "runtime/timeline.h"

namespace gradsync {

struct CycleOutcome {
  // To execute in this order. A kStallShutdown response, if any, is last. Valid until the
  // negotiator's next cycle: cached responses are the cache's (and the cache changes only during
  // a cycle), the others are kept in `owned`.
  std::vector<const Response*> responses;
  // Keeps alive what `responses` points to beyond the cache: the full round's responses, and any
  // cached response the full round might evict while this outcome points to it.
  std::vector<ResponsePtr> owned;
  // This rank's entry for each response, as given to RunCycle (null for a fatal response, or
  // when none was given).
  std::vector<TensorEntry*> entries;
  // Some rank asked to shut down: after this cycle's responses, every pending operation fails.
  bool shutdown = false;
  // This rank had joined by the time it negotiated: allreduces and barriers it never submitted may
  // be among the responses (with a null entry), and it takes part in them without data of its own.
  bool joined = false;
  // Some rank had joined by the time it negotiated this cycle (agreed in the round: the same on
  // every rank).
  bool someone_joined = false;
  // Every rank asked to lock its schedule in this cycle's round, and none holds anything sent
  // through a full round or anything but unnamed allreduces and broadcasts to send
  // (coordinator/locked_schedule.h); no full round ran. If the responses leave the schedule ready
  // (none, or exactly a whole step), every rank locks after running them, at the same point, and
  // hands the lock what it still holds (TakeAllPending: entries in the cache, and unnamed ones
  // not yet sent). Otherwise those unsent entries go in the next cycle's full round.
  bool lock_agreed = false;
  // Diagnostics for tests and the timeline.
  int cache_hits = 0;
  bool full_round = false;
};

class Negotiator {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic

  // `timeline`, when not null, gets a mark on rank 0 as each rank's request for a tensor arrives.
  // Messages name channel rank r as rank_labels[r] (a process set's global ranks) when given.
  Negotiator(ControlChannel* channel, const Config& config, Clock clock = nullptr,
             Timeline* timeline = nullptr, std::vector<int> rank_labels = {}, int32_t set_id = 0);

  // One cycle. `fresh` holds the entries that became ready on this rank since the last cycle (their
  // names are not pending); each stays valid, unchanged, until it comes back in an outcome. A
  // non-OK Status means this rank's control plane failed (an MPI error, or a response list that
  // does not parse): the caller fails what this negotiator holds (the entries already in *out, and
  // TakeAllPending) and does not run it again.
  // `want_lock`: this rank's locked schedule is ready to lock; it counts only when what this rank
  // holds after taking `fresh` could pass to the lock (LockMayTakePending).
  Status RunCycle(const std::vector<TensorEntry*>& fresh, bool want_shutdown, CycleOutcome* out,
                  bool want_lock = false);
  // The response the cache holds for `name`, the same on every rank; null if none.
  ResponsePtr CachedResponse(const std::string& name) const;
  // Forgets every pending entry and returns them in the order they were submitted: for a lock
  // (after an outcome with lock_agreed), or for a caller that fails them (its process set was
  // removed or failed), after which the negotiator must not run again.
  std::vector<TensorEntry*> TakeAllPending();

 private:
  // Where an entry for the full round stands; unused for entries the cache serves.
  enum class PendingState { kUncached, kSent };
  struct Pending {
    TensorEntry* entry = nullptr;
    PendingState state = PendingState::kUncached;
    double first_seen = 0.0;
    uint64_t sequence = 0;
  };
  // Bit-vector layout: word 0 holds flags, then the ready bits, then the invalid bits. Flags and
  // invalid bits are stored inverted so one bitwise AND yields the OR of them across ranks.
  enum Flag : uint64_t {
    kFlagShutdown = 1u << 0,
    kFlagUncached = 1u << 1,  // some rank has requests to send through the full round
    kFlagInspect = 1u << 2,   // rank 0 wants a full round to run the stall inspector
    // Some rank has joined: it sets no cache bits, so every request goes through the full round,
    // where rank 0 counts joined ranks as ready.
    kFlagJoined = 1u << 3,
    // Some rank does not want to lock its schedule, or holds something (see CycleOutcome).
    kFlagNoLock = 1u << 4,
  };

  void AddFresh(const std::vector<TensorEntry*>& fresh, double now, std::vector<uint32_t>* invalid);
  void HoldCached(uint32_t bit, const Pending& p);
  // Moves the entry held under `bit` to the full round.
  void Demote(uint32_t bit);
  // Moves every cached entry that no longer owns its bit (evicted or erased since it was looked
  // up) to the full round.
  void DemoteStale();
  // Sends every member of a group through the full round when any member must go there.
  void KeepGroupsTogether();
  // Demotes cached requests that were evicted or have waited past the stall warning; returns
  // whether any pending request now needs the full round.
  bool RefreshCachedState(double now, std::vector<uint32_t>* invalid);
  // Whether every pending entry is one a lock could take over: not yet sent, and an unnamed
  // allreduce or broadcast.
  bool LockMayTakePending() const;
  std::vector<uint64_t> BuildBitVector(bool want_shutdown, bool want_lock, bool has_uncached,
                                       const std::vector<uint32_t>& invalid, double now) const;
  void ApplyInvalidBits(const std::vector<uint64_t>& words);
  void TakeCachedReady(const std::vector<uint64_t>& words, CycleOutcome* out);
  Status FullRound(double now, CycleOutcome* out);
  // Rank 0: feeds the gathered requests to the table and lists the responses (a corrupt message
  // becomes a fatal response every rank receives).
  void CoordinatorRespond(const std::vector<std::string>& gathered, double now,
                          ResponseList* responses);
  // Forgets a pending name; returns its entry (null if the name was not pending).
  TensorEntry* Retire(const NameKey& name);
  // Forgets the entry held under `bit` and returns it (null if none).
  TensorEntry* RetireCached(uint32_t bit);
  // Unlinks what `bit` holds (a Pending with a null entry if nothing), leaving the counts below
  // alone.
  Pending TakeCached(uint32_t bit);
  // Updates the group and join counts for an entry that leaves negotiation.
  void Forget(const TensorEntry& entry);

  ControlChannel* channel_;
  Timeline* timeline_;
  Config config_;
  Clock clock_;
  int rank_;
  int size_;
  ResponseCache cache_;
  // Entries for the full round, keyed by the entry's name, valid while the entry is pending.
  NameTable<Pending> pending_;
  // Entries served by the cache, indexed by cache bit (a null entry: none holds the bit), with a
  // bit set in cached_bits_ for each. They are found by bit, not by name: on the steady-state path
  // nothing is hashed after the cache lookup.
  std::vector<Pending> cached_;
  std::vector<uint64_t> cached_bits_;
  size_t cached_count_ = 0;
  // No cached entry has waited since before this (a lower bound on their first_seen), so the
  // stall check scans cached_ only once this is old enough.
  double cached_oldest_ = 0.0;
  bool cache_changed_ = false;  // bits were erased or reassigned since the last DemoteStale
  uint64_t next_sequence_ = 0;
  size_t grouped_pending_ = 0;  // pending entries that belong to a group
  size_t joins_pending_ = 0;    // pending join entries (0 or 1)
  std::vector<int> rank_labels_;
  // Rank 0 only.
  std::unique_ptr<ReadinessTable> table_;
  std::unique_ptr<StallInspector> stall_;
};

}  // namespace gradsync
