#include "coordinator/readiness_table.h"

#include <algorithm>
#include <sstream>

#include "runtime/logging.h"

namespace gradsync {

namespace {

std::string FormatDouble(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

std::string ToText(OpType v) { return OpTypeName(v); }
std::string ToText(DataType v) { return DataTypeName(v); }
std::string ToText(ReduceOp v) { return ReduceOpName(v); }
std::string ToText(DeviceKind v) { return v == DeviceKind::kCpu ? "cpu" : "cuda"; }
std::string ToText(double v) { return FormatDouble(v); }
std::string ToText(int32_t v) { return std::to_string(v); }
std::string ToText(size_t v) { return std::to_string(v); }
std::string ToText(const std::vector<int64_t>& v) { return ShapeString(v); }
std::string ToText(const std::string& v) { return v.empty() ? "none" : "'" + v + "'"; }

// "rank 0 has float32; ranks 1, 3 have int32": ranks grouped by value, in order of appearance.
template <typename Get>
std::string DescribeValues(const std::vector<Request>& requests, Get value_of) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const Request& request : requests) {
    const std::string v = ToText(value_of(request));
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) {
      groups.push_back({v, {request.rank}});
    } else {
      it->second.push_back(request.rank);
    }
  }
  std::string out;
  for (const auto& [value, ranks] : groups) {
    if (!out.empty()) out += "; ";
    out += (ranks.size() == 1 ? "rank " : "ranks ") + RankListString(ranks);
    out += (ranks.size() == 1 ? " has " : " have ") + value;
  }
  return out;
}

// A Mismatch naming the field and every rank's value if `value_of` differs between ranks. Values
// are compared as they are and turned into text only for the message.
template <typename Get>
Status CheckAgree(const std::vector<Request>& requests, const char* field, Get value_of) {
  const auto first = value_of(requests[0]);
  for (size_t r = 1; r < requests.size(); ++r) {
    if (!(value_of(requests[r]) == first)) {
      return Status::Mismatch("mismatched " + std::string(field) + " for tensor '" +
                              requests[0].name + "': " + DescribeValues(requests, value_of));
    }
  }
  return Status::OK();
}

std::vector<int64_t> TrailingDims(const std::vector<int64_t>& shape) {
  if (shape.empty()) return {};
  return std::vector<int64_t>(shape.begin() + 1, shape.end());
}

// Join and process-set changes carry no tensor: only the operation and group are compared.
bool CarriesTensor(OpType op) {
  return op != OpType::kBarrier && op != OpType::kJoin && op != OpType::kAddProcessSet &&
         op != OpType::kRemoveProcessSet;
}

}  // namespace

Status ValidateRequests(const std::vector<Request>& requests, int size, Response* response,
                        const std::vector<int>& rank_labels) {
  GRADSYNC_RETURN_IF_ERROR(
      CheckAgree(requests, "operation", [](const Request& r) { return r.op; }));
  const OpType op = requests[0].op;
  GRADSYNC_RETURN_IF_ERROR(CheckAgree(requests, "group", [](const Request& r) { return r.group; }));
  GRADSYNC_RETURN_IF_ERROR(
      CheckAgree(requests, "group size", [](const Request& r) { return r.group_size; }));
  if (CarriesTensor(op)) {
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "device kind", [](const Request& r) { return r.device.kind; }));
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "dtype", [](const Request& r) { return r.dtype; }));
  }
  if (op == OpType::kAllgather || op == OpType::kAlltoall) {
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "rank (number of dimensions)",
                   [](const Request& r) { return std::max<size_t>(r.shape.size(), 1); }));
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(requests, "shape (after the first dimension)",
                                        [](const Request& r) { return TrailingDims(r.shape); }));
  } else if (CarriesTensor(op)) {
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "shape", [](const Request& r) { return r.shape; }));
  }
  if (op == OpType::kAllreduce || op == OpType::kReducescatter) {
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "reduce op", [](const Request& r) { return r.reduce_op; }));
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "prescale factor", [](const Request& r) { return r.prescale; }));
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "postscale factor", [](const Request& r) { return r.postscale; }));
  }
  if (op == OpType::kBroadcast) {
    // Roots are compared as sent, and named as the caller gave them: global ranks.
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(requests, "root rank", [&](const Request& r) {
      const bool labelled = r.root >= 0 && static_cast<size_t>(r.root) < rank_labels.size();
      return labelled ? rank_labels[r.root] : r.root;
    }));
    const int root = requests[0].root;
    if (root < 0 || root >= size) {
      return Status::InvalidArgument("broadcast of tensor '" + requests[0].name + "': root rank " +
                                     std::to_string(root) + " is outside [0, " +
                                     std::to_string(size) + ")");
    }
  }
  *response = ResponseFromRequest(requests[0]);
  if (op == OpType::kAllgather) {
    response->first_dims.reserve(requests.size());
    for (const Request& r : requests) {
      response->first_dims.push_back(r.shape.empty() ? 1 : r.shape[0]);
    }
  }
  return Status::OK();
}

ReadinessTable::ReadinessTable(int size, std::vector<int> rank_labels)
    : size_(size), rank_labels_(std::move(rank_labels)), joined_(size, false) {}

bool ReadinessTable::IsComplete(const Row& row) const {
  if (joined_count_ == 0) return row.count == size_;
  for (int r = 0; r < size_; ++r) {
    if (!row.present[r] && !joined_[r]) return false;
  }
  return true;
}

int ReadinessTable::FirstPresent(const Row& row) const {
  int r = 0;
  while (!row.present[r]) ++r;  // a row exists because some rank sent the name
  return r;
}

void ReadinessTable::MarkIfComplete(const std::string& name, Row* row) {
  if (row->complete || !IsComplete(*row)) return;
  row->complete = true;
  completed_.push_back(name);
}

bool ReadinessTable::Add(const Request& request, double now) {
  auto [it, inserted] = rows_.try_emplace(request.name);
  Row& row = it->second;
  const double first_seen = now - std::max(0.0, request.waited_seconds);
  if (inserted) {
    row.by_rank.resize(size_);
    row.present.assign(size_, false);
    row.first_seen = first_seen;
  } else {
    row.first_seen = std::min(row.first_seen, first_seen);
  }
  if (!row.present[request.rank]) {
    row.present[request.rank] = true;
    ++row.count;
  }
  row.by_rank[request.rank] = request;
  row.by_rank[request.rank].rank = Label(request.rank);
  const bool was_complete = row.complete;
  if (request.op == OpType::kJoin && !joined_[request.rank]) {
    joined_[request.rank] = true;
    ++joined_count_;
    last_joined_ = request.rank;
    // Names that waited only for this rank can run now; they complete before the join itself.
    for (auto& [name, other] : rows_) {
      if (&other != &row) MarkIfComplete(name, &other);
    }
  }
  MarkIfComplete(request.name, &row);
  return !was_complete && row.complete;
}

void ReadinessTable::TakeRunnable(std::vector<std::string>* runnable) {
  for (const std::string& name : completed_) {
    const Row& row = rows_.at(name);
    const Request* first = &row.by_rank[FirstPresent(row)];
    if (first->group_size <= 1) {
      runnable->push_back(name);
      continue;
    }
    std::vector<std::string>& held = held_groups_[first->group];
    held.push_back(name);
    if (held.size() < static_cast<size_t>(first->group_size)) continue;
    runnable->insert(runnable->end(), held.begin(), held.end());
    held_groups_.erase(first->group);
  }
  completed_.clear();
}

namespace {

// Whether an operation that the ranks in `absent` joined without submitting can run: they stand in
// for allreduces and barriers only, each with the op's identity, which every contribution's
// prescale scales too: min and max keep theirs under any factor (FillJoinedContribution), a
// product's 1 only under 0 and 1.
Status RunsBesideJoinedRanks(const std::string& name, OpType op, const Response& response,
                             const std::vector<int>& absent) {
  const std::string while_joined =
      " cannot run while " + std::string(absent.size() == 1 ? "rank " : "ranks ") +
      RankListString(absent) + (absent.size() == 1 ? " has" : " have") + " joined";
  if (op != OpType::kAllreduce && op != OpType::kBarrier) {
    return Status::Unsupported(OpTypeName(op) + " of tensor '" + name + "'" + while_joined +
                               " without submitting it; only allreduce and barrier run "
                               "alongside join()");
  }
  if (op == OpType::kAllreduce && response.reduce_op == ReduceOp::kProduct &&
      response.prescale != 1.0 && response.prescale != 0.0) {
    std::ostringstream factor;
    factor << response.prescale;
    return Status::Unsupported("allreduce of tensor '" + name + "' with op product and prescale " +
                               factor.str() + while_joined +
                               ": the joined ranks' contributions of 1 would be scaled too; scale "
                               "the tensor before the allreduce instead");
  }
  return Status::OK();
}

}  // namespace

Response ReadinessTable::TakeReady(const std::string& name) {
  auto it = rows_.find(name);
  const Row& row = it->second;
  std::vector<Request> present;
  std::vector<int> absent;  // joined ranks that did not send the name
  present.reserve(row.count);
  for (int r = 0; r < size_; ++r) {
    if (row.present[r]) {
      present.push_back(row.by_rank[r]);
    } else {
      absent.push_back(Label(r));
    }
  }
  Response response;
  Status status = ValidateRequests(present, size_, &response, rank_labels_);
  const OpType op = present.front().op;
  if (status.ok() && !absent.empty()) status = RunsBesideJoinedRanks(name, op, response, absent);
  if (!status.ok()) {
    response = Response();
    response.type = ResponseType::kError;
    response.name = name;
    response.error = status.message();
  } else if (op == OpType::kJoin) {
    response.root = Label(last_joined_);
  }
  // A join ends when its row is taken, even a failed one (say a tensor of the same name met it),
  // so that no rank stays counted as ready for names it never sends.
  for (int r = 0; r < size_; ++r) {
    if (row.present[r] && row.by_rank[r].op == OpType::kJoin && joined_[r]) {
      joined_[r] = false;
      --joined_count_;
    }
  }
  rows_.erase(it);
  return response;
}

std::vector<ReadinessTable::Waiting> ReadinessTable::WaitingNames() const {
  std::vector<Waiting> out;
  out.reserve(rows_.size());
  for (const auto& [name, row] : rows_) {
    if (row.complete) continue;  // held for its group
    // A joined rank waits for the others as long as they train; that is no stall.
    if (row.by_rank[FirstPresent(row)].op == OpType::kJoin) continue;
    Waiting w;
    w.name = name;
    w.first_seen = row.first_seen;
    for (int r = 0; r < size_; ++r) {
      if (row.present[r]) {
        w.ready_ranks.push_back(Label(r));
      } else if (!joined_[r]) {
        w.missing_ranks.push_back(Label(r));
      }
    }
    out.push_back(std::move(w));
  }
  std::sort(out.begin(), out.end(), [](const Waiting& a, const Waiting& b) {
    return a.first_seen != b.first_seen ? a.first_seen < b.first_seen : a.name < b.name;
  });
  return out;
}

std::vector<int> ReadinessTable::JoinedRanks() const {
  std::vector<int> out;
  for (int r = 0; r < size_; ++r) {
    if (joined_[r]) out.push_back(Label(r));
  }
  return out;
}

}  // namespace gradsync
