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
  explicit ReadinessTable(int size);

  // Records `request` (request.rank says whose). `now` is seconds on rank 0's clock; the request's
  // waited_seconds backdates when the name was first seen. Returns true when the name has just
  // become ready on every rank. A second request for a name from the same rank replaces the first.
  bool Add(const Request& request, double now);
  // Call once Add() has returned true for `name`. Appends to *runnable the names that may run now:
  // `name` itself; nothing while the rest of its group is not ready on every rank; or, when `name`
  // completes its group, every name of the group, in the order they became ready. A group is known
  // by rank 0's request; ranks that disagree about it get a mismatch error from TakeReady.
  void Release(const std::string& name, std::vector<std::string>* runnable);
  // Removes a ready name and returns the response every rank executes: the agreed parameters, or
  // a kError response whose message names the ranks and their differing values.
  Response TakeReady(const std::string& name);

  struct Waiting {
    std::string name;
    double first_seen = 0.0;
    std::vector<int> ready_ranks;
    std::vector<int> missing_ranks;
  };
  // Every name still waiting for some ranks, oldest first. Names that every rank has sent but that
  // wait for the rest of their group are left out: the members holding them up are listed.
  std::vector<Waiting> WaitingNames() const;
  bool empty() const { return rows_.empty(); }
  size_t size() const { return rows_.size(); }

 private:
  struct Row {
    std::vector<Request> by_rank;
    std::vector<bool> present;
    int count = 0;
    double first_seen = 0.0;
  };

  int size_;
  std::unordered_map<std::string, Row> rows_;
  // Group name -> its members ready on every rank so far.
  std::unordered_map<std::string, std::vector<std::string>> held_groups_;
};

// Checks that every rank's request for one name agrees; fills *response on success. On mismatch
// returns a Mismatch status whose message names the tensor, the field, and which ranks hold which
// value. `requests` is indexed by rank.
Status ValidateRequests(const std::vector<Request>& requests, Response* response);

}  // namespace gradsync
