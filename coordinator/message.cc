#include "coordinator/message.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gradsync {

bool Request::operator==(const Request& o) const {
  return name == o.name && op == o.op && dtype == o.dtype && shape == o.shape &&
         device == o.device && reduce_op == o.reduce_op && prescale == o.prescale &&
         postscale == o.postscale && root == o.root && rank == o.rank &&
         waited_seconds == o.waited_seconds && group == o.group && group_size == o.group_size;
}

bool Response::operator==(const Response& o) const {
  return type == o.type && name == o.name && dtype == o.dtype && shape == o.shape &&
         device == o.device && reduce_op == o.reduce_op && prescale == o.prescale &&
         postscale == o.postscale && root == o.root && first_dims == o.first_dims &&
         error == o.error && group == o.group && group_size == o.group_size;
}

ResponseType ResponseTypeFor(OpType op) {
  switch (op) {
    case OpType::kAllreduce:
      return ResponseType::kAllreduce;
    case OpType::kAllgather:
      return ResponseType::kAllgather;
    case OpType::kBroadcast:
      return ResponseType::kBroadcast;
    case OpType::kBarrier:
      return ResponseType::kBarrier;
    case OpType::kReducescatter:
      return ResponseType::kReducescatter;
    case OpType::kAlltoall:
      return ResponseType::kAlltoall;
    case OpType::kJoin:
      return ResponseType::kJoin;
    case OpType::kAddProcessSet:
      return ResponseType::kAddProcessSet;
    case OpType::kRemoveProcessSet:
      return ResponseType::kRemoveProcessSet;
  }
  // Enqueue and the wire parser both reject unknown ops, so reaching here is a gradsync bug.
  std::fprintf(stderr, "gradsync: internal error: no response type for op value %d\n",
               static_cast<int>(op));
  std::abort();
}

bool LockedPlanMayHold(ResponseType type) {
  return type == ResponseType::kAllreduce || type == ResponseType::kBroadcast;
}

Response ResponseFromRequest(const Request& request) {
  Response response;
  response.type = ResponseTypeFor(request.op);
  response.name = request.name;
  response.dtype = request.dtype;
  response.shape = request.shape;
  response.device = request.device;
  response.reduce_op = request.reduce_op;
  response.prescale = request.prescale;
  response.postscale = request.postscale;
  response.root = request.root;
  response.group = request.group;
  response.group_size = request.group_size;
  return response;
}

void RequestFromEntry(const TensorEntry& entry, int rank, double waited_seconds, Request* request) {
  request->name = entry.name;
  request->op = entry.op;
  request->dtype = entry.input.dtype;
  request->shape = entry.input.shape;
  request->device = entry.input.device;
  request->reduce_op = entry.reduce_op;
  request->prescale = entry.prescale;
  request->postscale = entry.postscale;
  request->root = entry.root;
  request->rank = rank;
  request->waited_seconds = waited_seconds;
  request->group = entry.group;
  request->group_size = entry.group_size;
}

RequestFields FieldsOf(const Request& request) {
  RequestFields f;
  f.name = request.name;
  f.op = request.op;
  f.dtype = request.dtype;
  f.shape = &request.shape;
  f.device = request.device;
  f.reduce_op = request.reduce_op;
  f.prescale = request.prescale;
  f.postscale = request.postscale;
  f.root = request.root;
  f.rank = request.rank;
  f.group = request.group;
  f.group_size = request.group_size;
  return f;
}

RequestFields FieldsOf(const TensorEntry& entry, int rank) {
  RequestFields f;
  f.name = entry.name;
  f.op = entry.op;
  f.dtype = entry.input.dtype;
  f.shape = &entry.input.shape;
  f.device = entry.input.device;
  f.reduce_op = entry.reduce_op;
  f.prescale = entry.prescale;
  f.postscale = entry.postscale;
  f.root = entry.root;
  f.rank = rank;
  // An ungrouped entry's group is empty; not reading it saves a cache line per cached tensor.
  if (entry.group_size != 0) f.group = entry.group;
  f.group_size = entry.group_size;
  return f;
}

namespace {

// Inline comparisons for the cache-hit test, which runs for every cached tensor of every step: the
// library's operator== for vectors and strings was an out-of-line call each.
bool SameBytes(std::string_view a, std::string_view b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}
bool SameDims(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// An allgather response carries rank 0's shape, so another rank's request matches it only through
// that rank's own entry in first_dims; comparing against rank 0's shape would both miss forever on
// ranks with a different first dimension and hit with a stale first_dims entry on others.
bool AllgatherShapeMatches(const Response& response, const RequestFields& request) {
  const std::vector<int64_t>& shape = *request.shape;
  if (response.first_dims.empty()) return SameDims(response.shape, shape);
  if (request.rank < 0 || static_cast<size_t>(request.rank) >= response.first_dims.size()) {
    return false;
  }
  if (shape.empty() || shape.size() != response.shape.size()) return false;
  if (shape[0] != response.first_dims[static_cast<size_t>(request.rank)]) return false;
  for (size_t i = 1; i < shape.size(); ++i) {
    if (shape[i] != response.shape[i]) return false;
  }
  return true;
}

}  // namespace

// Scalar fields first: this runs for every cached tensor of every step, and they are cheapest.
// Of the device, the kind alone: each rank's GPU is its own (cuda:1 on a node's second rank where
// the response, rank 0's, says cuda:0), as negotiation checks only that the ranks agree on the
// kind.
bool ParametersMatch(const Response& response, const RequestFields& request) {
  if (response.dtype != request.dtype || response.reduce_op != request.reduce_op ||
      response.prescale != request.prescale || response.postscale != request.postscale ||
      response.root != request.root || response.device.kind != request.device.kind ||
      response.group_size != request.group_size) {
    return false;
  }
  switch (response.type) {
    case ResponseType::kAllreduce:
    case ResponseType::kAllgather:
    case ResponseType::kBroadcast:
    case ResponseType::kBarrier:
    case ResponseType::kReducescatter:
    case ResponseType::kAlltoall:
      break;
    default:
      return false;  // error and shutdown responses never stand for a live request
  }
  if (response.type != ResponseTypeFor(request.op)) return false;
  const bool shape_matches = response.type == ResponseType::kAllgather
                                 ? AllgatherShapeMatches(response, request)
                                 : SameDims(response.shape, *request.shape);
  return shape_matches && SameBytes(response.group, request.group);
}

std::string ParameterDifference(const Response& planned, const RequestFields& request) {
  const auto both = [](const std::string& field, const std::string& mine,
                       const std::string& plans) {
    return "its " + field + " " + mine + " where the plan has " + plans;
  };
  if (planned.type != ResponseTypeFor(request.op)) return "another operation than the plan's";
  if (planned.dtype != request.dtype) {
    return both("dtype", DataTypeName(request.dtype), DataTypeName(planned.dtype));
  }
  if (planned.device.kind != request.device.kind) return "another device kind than the plan's";
  if (planned.reduce_op != request.reduce_op) {
    return both("reduce op", ReduceOpName(request.reduce_op), ReduceOpName(planned.reduce_op));
  }
  if (planned.prescale != request.prescale || planned.postscale != request.postscale) {
    return "other scale factors than the plan's";
  }
  if (planned.root != request.root) {
    return both("root", std::to_string(request.root), std::to_string(planned.root));
  }
  if (planned.group_size != request.group_size || planned.group != request.group) {
    return "another group than the plan's";
  }
  return both("shape", ShapeString(*request.shape), ShapeString(planned.shape));
}

bool ResponseMatches(const Response& response, const RequestFields& request) {
  return SameBytes(response.name, request.name) && ParametersMatch(response, request);
}

}  // namespace gradsync
