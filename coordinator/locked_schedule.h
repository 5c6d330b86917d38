// LockedSchedule: one process set's locked schedule (docs/protocol.md, "Locked schedule").
//
// While the set negotiates, Observe() watches the responses each cycle runs and cuts them into
// steps: a step ends where a name comes back, or as soon as it holds exactly the names of the step
// before. Once GRADSYNC_LOCK_AFTER_STEPS steps in a row held the same allreduces and broadcasts
// with the same parameters, the schedule is ready. The negotiator then asks, in its next round,
// whether every rank is ready, has seen its caller wait at the same points in those steps, and
// holds nothing that needs the full round; when all are, and the round's responses leave the
// schedule ready (none, or exactly one whole step: judged from the responses alone, so alike on
// every rank), every rank calls Lock() after running them, and the last step, in the order it ran,
// fused into runs of consecutive tensors (PlanFusion's consecutive plan), becomes the plan. No
// bucket holds tensors the caller enqueued on either side of a blocking wait
// (TensorEntry::waits_before): a caller that waits for one result before it enqueues the next
// tensor (a synchronized batch norm's statistics, a metric) would otherwise wait for a bucket that
// only its next enqueue can fill. Those waits follow the program's order, so every rank that runs
// the same program cuts alike; where ranks do cut differently, their plans' fingerprints differ and
// the first exchange leaves the lock.
//
// Locked, RunCycle() takes the set's fresh entries in place of the negotiator. Each goes to its
// slot in the plan, checked against the plan's parameters. When the next bucket in plan order is
// full, the ranks exchange one small AND carrying the bucket's fingerprint; once every rank has
// reached the bucket the exchange completes and the bucket is returned to run on the data plane.
// No request, response or coordinator is involved, and a bucket starts as soon as its last
// tensor arrives on the slowest rank.
//
// A rank leaves the lock by exchanging a release in place of the next bucket: when an entry does
// not fit the plan (a new name, other parameters, a join, a process set added), when its caller
// asks (shutdown), when it holds entries but the next bucket has not filled for
// GRADSYNC_LOCK_WAIT_MS, or when another rank that has waited that long on an exchange nudges it.
// Every rank sees the release in the same exchange, so every rank leaves after the same buckets,
// and hands what it holds back to negotiation, which runs it, or reports what differs, as it
// always has. No data moves before every rank has agreed on its bucket, so leaving never leaves a
// wrong result behind.
//
// Used by one thread at a time: the background thread, or a caller's cycle under the loop's cycle
// lock (BackgroundLoop::RunCycleForCaller).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "coordinator/fusion_planner.h"
#include "coordinator/lock_channel.h"
#include "coordinator/message.h"
#include "coordinator/negotiator.h"
#include "coordinator/unnamed_plan.h"
#include "runtime/config.h"
#include "runtime/name_table.h"

namespace gradsync {

struct LockSettings {
  bool enabled = true;
  int64_t after_steps = 3;    // identical steps before locking
  double wait_seconds = 1.0;  // GRADSYNC_LOCK_WAIT_MS
  double stall_warning_seconds = 60.0;
  double stall_shutdown_seconds = 300.0;  // Config::PeerThreadGiveUpSeconds(); 0: never
  // The most names a step may hold and still count; a longer one is cut there and never locks.
  // It could not lock anyway (Lock() finds every name in the response cache, which holds
  // GRADSYNC_CACHE_CAPACITY), and names that never come back (unnamed operations, each named
  // after its call) would otherwise grow the step without end.
  size_t longest_step = 1024;
  // GRADSYNC_CALLER_LAUNCH=single: one exchange never agrees on a bucket of one tensor together
  // with a fused one, since different threads run them (see RunCycle's `most_tensors`).
  bool single_apart = false;

  static LockSettings From(const Config& config);
};

// What a locked cycle gives back to run.
struct LockedCycle {
  // Buckets every rank agreed on, to run in this order; each outcome's responses are one planned
  // bucket and its entries this rank's, slot by slot. The responses are the plan's, not the
  // outcome's (its `owned` is empty): valid until the schedule next locks, which no locked cycle
  // does, so for as long as the cycle that ran them.
  std::vector<CycleOutcome> buckets;
  // The set left the lock in this cycle, after `buckets`: what this rank held goes back to
  // negotiation (in plan order from the bucket it left at, then what did not fit the plan).
  bool unlocked = false;
  std::string reason;
  std::vector<TensorEntry*> returned;
};

class LockedSchedule {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic
  using CachedResponse = std::function<ResponsePtr(const std::string& name)>;

  // `set_id` names the set in messages.
  LockedSchedule(std::unique_ptr<LockChannel> channel, const LockSettings& settings, int32_t set_id,
                 Clock clock = nullptr);

  // Negotiated: the responses a cycle ran, in order; the same on every rank.
  void Observe(const CycleOutcome& outcome);
  // Whether enough identical steps have run, judged by what every rank sees alike (the responses'
  // names and parameters), so that after a round in which every rank offered to lock, every rank
  // decides alike whether the cycle's responses left the schedule ready.
  bool ready() const;
  // Whether this rank offers to lock: ready(), and its caller's waits cut the last steps alike
  // (a plan cut where the caller no longer waits, or not cut where it now does, would not fit).
  // Where ranks cut differently, their plans' fingerprints differ and the first exchange leaves.
  bool WantsToLock() const;
  // On every rank at the same point (after the round that agreed): takes the last whole step as
  // the plan, each response as `cached` holds it, fused by `fusion`; what the step under way has
  // run already is left out of this step's turn of its buckets. Stays unlocked, on every rank
  // alike, when a response is no longer cached or the step under way ran a name the plan lacks;
  // fails when the channel does (this rank's).
  Status Lock(const FusionSettings& fusion, const CachedResponse& cached);
  bool locked() const { return locked_; }

  // Locked: places `fresh`, then exchanges and returns the buckets every rank has reached.
  // `release` (with `why`) leaves the lock at the next exchange. A failure is this rank's control
  // plane, or a stall past GRADSYNC_STALL_SHUTDOWN_SECONDS. With `poll_peers`, an exchange the
  // others have not joined yet is looked at between yields for a while before it returns; a
  // caller's thread, which has its own work to do, passes false and looks once. No bucket of
  // more than `most_tensors` is exchanged or returned (GRADSYNC_CALLER_LAUNCH=single leaves fused
  // buckets to the loop's thread): the cycle stops before it, and MissingForNextBucket() says 0.
  // A failure after buckets every rank agreed on is returned by the next call, after those run.
  Status RunCycle(const std::vector<TensorEntry*>& fresh, bool release, const std::string& why,
                  LockedCycle* out, bool poll_peers = true, size_t most_tensors = SIZE_MAX);
  // Whether an exchange is in flight, or a failure waits for the next RunCycle: the background
  // thread should run a cycle again soon.
  bool exchanging() const { return in_flight_ || !deferred_failure_.ok(); }
  // Locked: how many more of this rank's tensors the next bucket needs before it can start (0
  // while its exchange is in flight or a release is pending).
  size_t MissingForNextBucket() const;
  // Locked: how many tensors the next bucket holds (0 unlocked), counting, in the turn the lock
  // began in, those that step ran negotiated.
  size_t NextBucketSize() const { return locked_ ? buckets_[cursor_].responses.size() : 0; }
  // Every entry it holds (in plan order from the next bucket, then what did not fit the plan),
  // for negotiation or a caller that fails them; the schedule is left unlocked.
  std::vector<TensorEntry*> TakeAllHeld();

  // Diagnostics.
  size_t planned_buckets() const { return buckets_.size(); }
  // The names the observed steps keep storage for: two steps of at most longest_step + 1.
  size_t observed_names_kept() const { return current_.names.size() + previous_.names.size(); }

 private:
  struct PlannedBucket {
    std::vector<ResponsePtr> responses;
    std::vector<TensorEntry*> slots;  // this rank's entry per response, null until it arrives
    // Only in the step the lock began in: responses that step already ran negotiated. Their slots
    // take the next step's entries, which wait for the bucket's next turn.
    std::vector<char> done;
    size_t done_count = 0;
    size_t filled = 0;  // slots of this turn (not done) that hold an entry

    bool full() const { return filled + done_count == responses.size(); }
  };
  struct Position {
    uint32_t bucket = 0;
    uint32_t index = 0;
  };
  // The observed step being cut: names (kept, storage reused), an order-free fingerprint of
  // their responses (the same on every rank), and where this rank's caller waited among them.
  struct Step {
    std::vector<std::string> names;
    std::vector<uint64_t> waits_before;  // each name's entry's TensorEntry::waits_before
    size_t count = 0;
    std::unordered_set<uint64_t> name_hashes;  // of its named tensors
    uint64_t fingerprint = 0;
    uint64_t cuts = 0;  // this rank's own: a sum over the names that follow a wait
    bool lockable = true;

    // Empty again, keeping the names' storage.
    void Restart() {
      count = 0;
      name_hashes.clear();
      fingerprint = 0;
      cuts = 0;
      lockable = true;
    }
  };

  void CloseStep();
  // The plan's buckets, as indices into `order` (the last whole step): runs between waits, each
  // fused into runs of consecutive tensors.
  std::vector<std::vector<size_t>> PlanBuckets(const std::vector<ResponsePtr>& order,
                                               const FusionSettings& fusion) const;
  // Moves the cursor to the next bucket with anything to run in this turn, ending the turns of
  // buckets the lock's first step had run in full.
  void AdvanceCursor();
  // Ends the first step's exceptions for `bucket`: its slots all belong to this turn again.
  static void EndFirstStep(PlannedBucket* bucket);
  // Where the plan puts the tensor named `key`: by name, or for a generated name (unnamed_) by its
  // number, which sets `*generated`. Null when the plan has no place for it.
  const Position* FindPosition(const NameKey& key, bool* generated = nullptr) const;
  // Whether this rank has not yet submitted all the plan puts before `position`, from the cursor
  // on: an unnamed operation placed by number there would be one the steps do not have.
  bool AheadOfPlan(const Position& position) const;
  void Place(TensorEntry* entry, double now);
  // Exchanges and emits until nothing more can happen without waiting.
  Status Advance(LockedCycle* out, bool poll_peers);
  Status StartExchange(bool release, double now);
  // Handles a completed exchange: the buckets every rank has full run, or every rank leaves.
  void Finish(const std::vector<uint64_t>& words, LockedCycle* out);
  // Bit i: the i-th bucket from the cursor is full on this rank (up to the plan's end, and only
  // past the cursor where the lock's first step ran nothing of the bucket).
  uint64_t FullBuckets() const;
  // Hands the cursor's bucket to `out` and moves the cursor on.
  void EmitBucket(LockedCycle* out);
  void Leave(const std::string& why, LockedCycle* out);
  // While an exchange waits: nudges the others, warns, and past the shutdown time fails.
  Status WhileWaiting(double now);
  // " (not there: ranks ...)", the ranks not known to have reached the exchange in flight, for
  // WhileWaiting's warning and error; empty when none is known.
  std::string NotArrivedText();
  static std::string Milliseconds(double seconds);  // "12 ms", for reasons and warnings
  std::string MissingNames(const PlannedBucket& bucket) const;

  std::unique_ptr<LockChannel> channel_;
  LockSettings settings_;
  int32_t set_id_;
  Clock clock_;

  // Negotiated.
  Step current_;
  Step previous_;
  int64_t streak_ = 0;      // identical steps in a row
  int64_t cut_streak_ = 0;  // of those, the last ones cut alike by this rank's waits

  // Locked.
  bool locked_ = false;
  uint64_t plan_fingerprint_ = 0;
  std::vector<PlannedBucket> buckets_;
  NameTable<Position> positions_;         // the plan's named tensors
  UnnamedPlan unnamed_;                   // and its generated names, by number
  std::vector<Position> step_positions_;  // by index in the plan's step
  size_t cursor_ = 0;                     // the next bucket to exchange
  size_t held_ = 0;                       // entries in slots
  std::vector<TensorEntry*> deviations_;  // entries that do not fit the plan
  std::string leave_reason_;              // set: the next exchange releases
  double last_progress_ = 0.0;
  bool in_flight_ = false;
  // A failure that came after buckets every rank had agreed on, which RunCycle returned to run
  // first; the next RunCycle returns it.
  Status deferred_failure_;
  uint64_t exchanges_ = 0;   // started on this channel, the same count on every rank
  double started_at_ = 0.0;  // of the exchange in flight
  double next_nudge_ = 0.0;
  double next_warning_ = 0.0;
  uint64_t nudged_ = 0;             // the highest exchange another rank said it waits on
  size_t most_tensors_ = SIZE_MAX;  // RunCycle's, for the cycle under way
  std::vector<uint64_t> words_;
};

}  // namespace gradsync
