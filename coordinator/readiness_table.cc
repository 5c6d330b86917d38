#include "coordinator/readiness_table.h"

#include <algorithm>
#include <functional>
#include <sstream>

namespace gradsync {

namespace {

std::string FormatDouble(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// "rank 0 has float32; ranks 1, 3 have int32" grouped by value, in rank order of first appearance.
std::string DescribeValues(const std::vector<Request>& requests,
                           const std::function<std::string(const Request&)>& value_of) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < requests.size(); ++r) {
    const std::string v = value_of(requests[r]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) {
      groups.push_back({v, {static_cast<int>(r)}});
    } else {
      it->second.push_back(static_cast<int>(r));
    }
  }
  std::string out;
  for (const auto& [value, ranks] : groups) {
    if (!out.empty()) out += "; ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    out += (ranks.size() == 1 ? " has " : " have ") + value;
  }
  return out;
}

// Returns a Mismatch status if `value_of` differs between ranks.
Status CheckAgree(const std::vector<Request>& requests, const char* field,
                  const std::function<std::string(const Request&)>& value_of) {
  const std::string first = value_of(requests[0]);
  for (size_t r = 1; r < requests.size(); ++r) {
    if (value_of(requests[r]) != first) {
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

}  // namespace

Status ValidateRequests(const std::vector<Request>& requests, Response* response) {
  GRADSYNC_RETURN_IF_ERROR(
      CheckAgree(requests, "operation", [](const Request& r) { return OpTypeName(r.op); }));
  const OpType op = requests[0].op;
  if (op != OpType::kBarrier) {
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(requests, "device kind", [](const Request& r) {
      return std::string(r.device.kind == DeviceKind::kCpu ? "cpu" : "cuda");
    }));
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "dtype", [](const Request& r) { return DataTypeName(r.dtype); }));
  }
  if (op == OpType::kAllgather) {
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(requests, "rank (number of dimensions)", [](const Request& r) {
      return std::to_string(std::max<size_t>(r.shape.size(), 1));
    }));
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(requests, "shape (after the first dimension)",
                                        [](const Request& r) {
                                          return ShapeString(TrailingDims(r.shape));
                                        }));
  } else if (op != OpType::kBarrier) {
    GRADSYNC_RETURN_IF_ERROR(
        CheckAgree(requests, "shape", [](const Request& r) { return ShapeString(r.shape); }));
  }
  if (op == OpType::kAllreduce) {
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(requests, "reduce op", [](const Request& r) {
      return ReduceOpName(r.reduce_op);
    }));
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(
        requests, "prescale factor", [](const Request& r) { return FormatDouble(r.prescale); }));
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(
        requests, "postscale factor", [](const Request& r) { return FormatDouble(r.postscale); }));
  }
  if (op == OpType::kBroadcast) {
    GRADSYNC_RETURN_IF_ERROR(CheckAgree(requests, "root rank", [](const Request& r) {
      return std::to_string(r.root);
    }));
    const int root = requests[0].root;
    if (root < 0 || root >= static_cast<int>(requests.size())) {
      return Status::InvalidArgument("broadcast of tensor '" + requests[0].name + "': root rank " +
                                     std::to_string(root) + " is outside [0, " +
                                     std::to_string(requests.size()) + ")");
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

ReadinessTable::ReadinessTable(int size) : size_(size) {}

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
  return row.count == size_;
}

Response ReadinessTable::TakeReady(const std::string& name) {
  auto it = rows_.find(name);
  Response response;
  const Status status = ValidateRequests(it->second.by_rank, &response);
  if (!status.ok()) {
    response = Response();
    response.type = ResponseType::kError;
    response.name = name;
    response.error = status.message();
  }
  rows_.erase(it);
  return response;
}

std::vector<ReadinessTable::Waiting> ReadinessTable::WaitingNames() const {
  std::vector<Waiting> out;
  out.reserve(rows_.size());
  for (const auto& [name, row] : rows_) {
    Waiting w;
    w.name = name;
    w.first_seen = row.first_seen;
    for (int r = 0; r < size_; ++r) (row.present[r] ? w.ready_ranks : w.missing_ranks).push_back(r);
    out.push_back(std::move(w));
  }
  std::sort(out.begin(), out.end(), [](const Waiting& a, const Waiting& b) {
    return a.first_seen != b.first_seen ? a.first_seen < b.first_seen : a.name < b.name;
  });
  return out;
}

}  // namespace gradsync
