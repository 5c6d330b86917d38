// ReadinessTable: rank 0's record of which ranks have sent which tensor, and the validation that
// turns a complete set of requests into one response (or a mismatch error naming the ranks).
//
// Owned and used by rank 0's background thread only.
#pragma once

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/message.h"

namespace gradsync {

class ReadinessTable {
 public:
  // `size` ranks, numbered 0..size-1 in requests. Messages name rank r as rank_labels[r] (its
  // global rank, for a process set); empty labels name ranks as they are numbered.
  explicit ReadinessTable(int size, std::vector<int> rank_labels = {});

  // Records `request` (request.rank says whose). `now` is seconds on rank 0's clock; the request's
  // waited_seconds backdates when the name was first seen. A second request for a name from the
  // same rank replaces the first. A join request marks its rank joined: from then on no name
  // waits for that rank, which may complete other names at once. Returns true when the request's
  // own name has just become complete.
  bool Add(const Request& request, double now);
  // Appends to *runnable the names that may run now, of those completed since the last call, in
  // the order they completed: a lone name at once; a group's names once all of them are complete,
  // all together. A group is known by its first request; ranks that disagree about it get a
  // mismatch error from TakeReady.
  void TakeRunnable(std::vector<std::string>* runnable);
  // Removes a runnable name and returns the response every rank executes: the agreed parameters,
  // or a kError response whose message names the ranks and their differing values (or the joined
  // ranks that keep a collective from running). Taking the join response ends the join: every
  // rank is unjoined again.
  Response TakeReady(const std::string& name);

  struct Waiting {
    std::string name;
    double first_seen = 0.0;
    std::vector<int> ready_ranks;    // labels
    std::vector<int> missing_ranks;  // labels; joined ranks are not missing
  };
  // Every name still waiting for some ranks, oldest first. Names complete on every rank but waiting
  // for the rest of their group are left out: the members holding them up are listed.
  std::vector<Waiting> WaitingNames() const;
  bool empty() const { return rows_.empty(); }
  size_t size() const { return rows_.size(); }
  // Ranks (labels) that have joined and wait for the others.
  std::vector<int> JoinedRanks() const;

 private:
  struct Row {
    std::vector<Request> by_rank;
    std::vector<bool> present;
    int count = 0;
    double first_seen = 0.0;
    bool complete = false;
  };
  // Every rank has sent the name or has joined.
  bool IsComplete(const Row& row) const;
  int FirstPresent(const Row& row) const;
  void MarkIfComplete(const std::string& name, Row* row);
  int Label(int rank) const { return rank_labels_.empty() ? rank : rank_labels_[rank]; }

  int size_;
  std::vector<int> rank_labels_;
  std::unordered_map<std::string, Row> rows_;
  std::vector<std::string> completed_;  // complete names not yet given out by TakeRunnable
  // Group name -> its members complete so far.
  std::unordered_map<std::string, std::vector<std::string>> held_groups_;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = 0;
};

// Checks that every rank's request for one name agrees; fills *response on success. On mismatch
// returns a Mismatch status whose message names the tensor, the field, and which ranks hold which
// value. `requests` holds one request per rank taking part (in rank order); messages name each by
// its `rank` field. `size` is the number of ranks in the set, for the broadcast root's range.
// `rank_labels`: a process set's members' global ranks, which broadcast roots (set ranks on the
// wire) are reported as; empty for the global set.
Status ValidateRequests(const std::vector<Request>& requests, int size, Response* response,
                        const std::vector<int>& rank_labels = {});

}  // namespace gradsync
