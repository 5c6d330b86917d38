// Requests and responses with every field set away from its default, for the tests of the
// messages and of their wire format.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "coordinator/message.h"

namespace gradsync {

inline Request MakeRequest(const std::string& name, std::vector<int64_t> shape = {4, 3}) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = DataType::kBFloat16;
  r.shape = std::move(shape);
  r.device = Device::Cuda(3);
  r.reduce_op = ReduceOp::kAverage;
  r.prescale = 0.5;
  r.postscale = 1.0 / 3.0;
  r.root = 2;
  r.rank = 7;
  r.waited_seconds = 12.25;
  return r;
}

inline Response MakeResponse(const std::string& name,
                             ResponseType type = ResponseType::kAllreduce) {
  Response p;
  p.type = type;
  p.name = name;
  p.dtype = DataType::kFloat16;
  p.shape = {8, 2, 5};
  p.device = Device::Cpu();
  p.reduce_op = ReduceOp::kMax;
  p.prescale = -2.5;
  p.postscale = 1e-300;
  p.root = 1;
  return p;
}

}  // namespace gradsync
