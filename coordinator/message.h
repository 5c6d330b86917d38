// Negotiation messages. A Request says "this rank has tensor NAME ready, with these parameters";
// a Response says "every rank executes this now" (or "this failed, with this message"). Their byte
// format is in wire_format.h and docs/protocol.md.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gradsync/types.h"
#include "runtime/tensor_entry.h"

namespace gradsync {

struct Request {
  std::string name;
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  Device device;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = 0;
  int32_t rank = 0;             // the sender (rank 0's table relabels it with the global rank)
  double waited_seconds = 0.0;  // how long the sender has held it, for the stall inspector
  // Grouped operations: the group's name and number of tensors; empty and 0 for a lone tensor.
  std::string group;
  int32_t group_size = 0;

  bool operator==(const Request& o) const;
};

struct RequestList {
  std::vector<Request> requests;
};

// Wire values: never renumber, only append.
enum class ResponseType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kError = 4,          // the named tensor fails on every rank with `error`; the runtime goes on
  kStallShutdown = 5,  // every pending operation fails with `error`; the runtime shuts down
  kReducescatter = 6,
  kAlltoall = 7,
  kJoin = 8,  // every rank has joined; `root` is the last rank to join
  kAddProcessSet = 9,
  kRemoveProcessSet = 10,
};
constexpr int kNumResponseTypes = 11;

// The fields the cache-hit test reads for every cached tensor of every step come first, the
// scalars together, so that the test touches two cache lines of a cached response.
struct Response {
  ResponseType type = ResponseType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root = 0;
  int32_t group_size = 0;
  Device device;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;  // the agreed shape (allgather: rank 0's)
  std::string name;
  std::string group;                // as in Request: a group's responses run in one cycle
  std::vector<int64_t> first_dims;  // allgather: every rank's first dimension, by rank
  std::string error;                // kError, kStallShutdown

  bool operator==(const Response& o) const;
};

struct ResponseList {
  std::vector<Response> responses;
};

// Responses are shared, not copied, between the cache and the cycles that execute them.
using ResponsePtr = std::shared_ptr<const Response>;

ResponseType ResponseTypeFor(OpType op);
// Whether a locked schedule's plan may hold responses of `type`: the collectives whose every
// rank's parameters a response states whole. Allreduces, and broadcasts because a training step
// has one (DDP's buffers, every forward); an allgather's or alltoall's sizes can change on one
// rank alone, which only negotiation sees. A step with any other collective does not lock.
bool LockedPlanMayHold(ResponseType type);
// The response that executes `request` (its agreed parameters); first_dims left empty.
Response ResponseFromRequest(const Request& request);
// Fills *request with what this rank sends for `entry`. Assigning into a reused Request keeps its
// storage, so the hot path does not allocate.
void RequestFromEntry(const TensorEntry& entry, int rank, double waited_seconds, Request* request);

// The parameters a cached response must agree with, viewed in place in a Request or a TensorEntry
// so that the cache-hit test copies nothing. Valid while what it views is unchanged.
struct RequestFields {
  std::string_view name;
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  const std::vector<int64_t>* shape = nullptr;
  Device device;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = 0;
  int32_t rank = 0;
  std::string_view group;
  int32_t group_size = 0;
};
RequestFields FieldsOf(const Request& request);
// What this rank would send for `entry` (RequestFromEntry), less the wait time.
RequestFields FieldsOf(const TensorEntry& entry, int rank);

// True when a cached response still describes the request exactly (the cache-hit test).
bool ResponseMatches(const Response& response, const RequestFields& request);
// ResponseMatches less the name, for a caller that found the response by the request's name.
bool ParametersMatch(const Response& response, const RequestFields& request);
// Where ParametersMatch fails, what of `request` differs from `planned`, for a message: the first
// field that differs, with both values where they have names ("its dtype float16 where the plan
// has float32").
std::string ParameterDifference(const Response& planned, const RequestFields& request);

}  // namespace gradsync
