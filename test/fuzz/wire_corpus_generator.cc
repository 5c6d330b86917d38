// Writes the seed corpus of the wire-format fuzz targets: serialized request and response lists
// of the kinds a training job really exchanges (a ResNet step, a BERT grouped allreduce, an
// allgather with per-rank first dimensions, a dtype mismatch error, a stall shutdown, join,
// process sets, ...), one message per file.
//
//   wire_corpus_generator OUT_DIR
//
// writes OUT_DIR/request_list/*.msg and OUT_DIR/response_list/*.msg, replacing what those two
// directories held. Before writing, it checks that each message parses back to its value and
// that the seeds together use every op, response type, dtype, reduce op and device kind, so a new
// enum value cannot go unfuzzed unnoticed.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "coordinator/message.h"
#include "coordinator/wire_format.h"
#include "test/fuzz/wire_fuzz_target.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;

struct Param {
  const char* name;
  std::vector<int64_t> shape;
};

// A slice of torchvision's ResNet-50 parameters, in the order backward produces their gradients.
const std::vector<Param>& ResNet50Tail() {
  static const std::vector<Param> params = {
      {"fc.bias", {1000}},
      {"fc.weight", {1000, 2048}},
      {"layer4.2.bn3.bias", {2048}},
      {"layer4.2.bn3.weight", {2048}},
      {"layer4.2.conv3.weight", {2048, 512, 1, 1}},
      {"layer4.2.conv2.weight", {512, 512, 3, 3}},
      {"layer3.0.downsample.0.weight", {1024, 512, 1, 1}},
      {"layer3.0.conv2.weight", {256, 256, 3, 3}},
      {"layer3.0.bn2.weight", {256}},
      {"conv1.weight", {64, 3, 7, 7}},
  };
  return params;
}

Request MakeRequest(const std::string& name, OpType op, DataType dtype, std::vector<int64_t> shape,
                    Device device, int32_t rank) {
  Request q;
  q.name = name;
  q.op = op;
  q.dtype = dtype;
  q.shape = std::move(shape);
  q.device = device;
  q.rank = rank;
  return q;
}

// One rank's gradients of a ResNet-50 step: averaged on the GPU, as DDP-style training does.
RequestList ResNetStep(int32_t rank, DataType dtype, double waited_seconds) {
  RequestList list;
  for (const Param& p : ResNet50Tail()) {
    Request q =
        MakeRequest(p.name, OpType::kAllreduce, dtype, p.shape, Device::Cuda(rank % 8), rank);
    q.reduce_op = ReduceOp::kAverage;
    q.waited_seconds = waited_seconds;
    list.requests.push_back(q);
  }
  return list;
}

// BERT's attention projections sent as one group, fp16 with a loss scale folded into the scales.
RequestList BertGroup(int32_t rank) {
  RequestList list;
  const std::string prefix = "bert.encoder.layer.11.attention.self.";
  const char* members[] = {"query.weight", "key.weight", "value.weight"};
  for (const char* member : members) {
    Request q = MakeRequest(prefix + member, OpType::kAllreduce, DataType::kFloat16, {768, 768},
                            Device::Cuda(3), rank);
    q.prescale = 1.0 / 65536.0;
    q.postscale = 1.0 / 16.0;
    q.group = prefix + members[0];
    q.group_size = 3;
    list.requests.push_back(q);
  }
  return list;
}

// Every op once, with the parameters the bindings give each.
RequestList EveryOp(int32_t rank) {
  RequestList list;
  Request broadcast = MakeRequest("transformer.h.0.attn.c_attn.weight", OpType::kBroadcast,
                                  DataType::kFloat32, {768, 2304}, Device::Cpu(), rank);
  broadcast.root = 0;
  Request running_mean = MakeRequest("layer3.0.bn2.running_mean", OpType::kBroadcast,
                                     DataType::kFloat32, {256}, Device::Cuda(1), rank);
  running_mean.root = 2;
  Request gather = MakeRequest("embedding.sparse_rows", OpType::kAllgather, DataType::kInt64,
                               {37, 768}, Device::Cpu(), rank);
  Request scatter = MakeRequest("zero.bucket.0.flat_grads", OpType::kReducescatter,
                                DataType::kBFloat16, {32768}, Device::Cuda(0), rank);
  Request alltoall = MakeRequest("moe.layer5.expert_dispatch", OpType::kAlltoall,
                                 DataType::kFloat32, {64, 1024}, Device::Cuda(5), rank);
  Request barrier =
      MakeRequest("epoch.end.barrier", OpType::kBarrier, DataType::kUInt8, {}, Device::Cpu(), rank);
  Request join =
      MakeRequest("gradsync.join", OpType::kJoin, DataType::kFloat32, {}, Device::Cpu(), rank);
  Request add = MakeRequest("gradsync.add_process_set.0", OpType::kAddProcessSet,
                            DataType::kFloat32, {}, Device::Cpu(), rank);
  Request remove = MakeRequest("gradsync.remove_process_set.1", OpType::kRemoveProcessSet,
                               DataType::kFloat32, {}, Device::Cpu(), rank);
  list.requests = {broadcast, running_mean, gather, scatter, alltoall, barrier, join, add, remove};
  return list;
}

// Every dtype and reduce op on shapes from a scalar to five dimensions, and empty tensors.
RequestList DtypeAndShapeSweep() {
  RequestList list;
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {1}, {0}, {0, 128}, {3, 5}, {2, 3, 4, 5, 6}, {1, 1, 1, 1, 1, 1, 1, 1}};
  for (int d = 0; d < kNumDataTypes; ++d) {
    const auto dtype = static_cast<DataType>(d);
    const auto reduce_op = static_cast<ReduceOp>(d % kNumReduceOps);
    Request q = MakeRequest("sweep." + DataTypeName(dtype) + "." + ReduceOpName(reduce_op),
                            OpType::kAllreduce, dtype, shapes[d % shapes.size()],
                            d % 2 ? Device::Cuda(d) : Device::Cpu(), 1);
    q.reduce_op = reduce_op;
    list.requests.push_back(q);
  }
  return list;
}

Response Agreed(const Request& q) { return ResponseFromRequest(q); }

ResponseList AgreedList(const RequestList& requests) {
  ResponseList list;
  for (const Request& q : requests.requests) list.responses.push_back(Agreed(q));
  return list;
}

// The responses of EveryOp(), with what rank 0 adds: the allgather's first dimensions of four
// ranks (one of them empty) and the last rank to join.
ResponseList EveryOpResponses() {
  ResponseList list = AgreedList(EveryOp(0));
  for (Response& p : list.responses) {
    if (p.type == ResponseType::kAllgather) p.first_dims = {37, 41, 0, 12};
    if (p.type == ResponseType::kJoin) p.root = 3;
  }
  return list;
}

Response MismatchError() {
  Response p = Agreed(ResNetStep(0, DataType::kFloat32, 0).requests[7]);
  p.type = ResponseType::kError;
  p.error =
      "mismatched dtype for tensor 'layer3.0.conv2.weight': ranks 0, 2, 3 have float32; rank 1 "
      "has float16";
  return p;
}

Response StallShutdown() {
  Response p;
  p.type = ResponseType::kStallShutdown;
  p.error =
      "stalled for more than 300.0 s (GRADSYNC_STALL_SHUTDOWN_SECONDS); some ranks never "
      "submitted these collectives: tensor 'layer4.2.conv3.weight' waited 301.2 s, missing on "
      "rank 3 (ready on 0-2); tensor 'fc.bias' waited 300.4 s, missing on ranks 2, 3 (ready on "
      "0, 1). Every pending operation is failed and gradsync shuts down instead of hanging.";
  return p;
}

// A rank joined early: an allgather it never sent fails, allreduces still run.
ResponseList JoinedRankRound() {
  ResponseList list = AgreedList(ResNetStep(0, DataType::kFloat32, 0));
  Response gather = Agreed(EveryOp(0).requests[2]);
  gather.type = ResponseType::kError;
  gather.error = "allgather 'embedding.sparse_rows' cannot run: rank 3 has joined";
  list.responses.push_back(gather);
  Response join = Agreed(EveryOp(0).requests[6]);
  join.root = 1;
  list.responses.push_back(join);
  return list;
}

// Only names seed files; the wire carries the number.
std::string ResponseTypeLabel(ResponseType type) {
  static const char* const kLabels[kNumResponseTypes] = {
      "allreduce", "allgather",       "broadcast",         "barrier",
      "error",     "stall_shutdown",  "reducescatter",     "alltoall",
      "join",      "add_process_set", "remove_process_set"};
  return kLabels[static_cast<int>(type)];
}

using Corpus = std::vector<std::pair<std::string, std::string>>;  // file name, bytes

template <typename Codec>
bool AddSeed(const std::string& name, const typename Codec::List& list, Corpus* corpus) {
  std::string bytes = Codec::Serialize(list);
  typename Codec::List back;
  if (!Codec::Parse(bytes, &back).ok() || !Codec::Same(back, list)) {
    std::fprintf(stderr, "wire_corpus_generator: seed '%s' does not round-trip\n", name.c_str());
    return false;
  }
  corpus->emplace_back(name + ".msg", std::move(bytes));
  return true;
}

bool BuildRequestSeeds(Corpus* corpus) {
  RequestList stalled = ResNetStep(2, DataType::kFloat32, 301.5);
  stalled.requests.resize(3);
  RequestList unicode;
  unicode.requests.push_back(MakeRequest("\xCE\xB8.\xE6\xA2\xAF\xE5\xBA\xA6.weight",
                                         OpType::kAllreduce, DataType::kFloat32, {7}, Device::Cpu(),
                                         0));
  bool ok = AddSeed<fuzz::RequestListCodec>("empty", {}, corpus);
  ok &= AddSeed<fuzz::RequestListCodec>("resnet50_step_rank1_fp32",
                                        ResNetStep(1, DataType::kFloat32, 0.0021), corpus);
  ok &= AddSeed<fuzz::RequestListCodec>("resnet50_step_rank6_bf16",
                                        ResNetStep(6, DataType::kBFloat16, 0.0), corpus);
  ok &= AddSeed<fuzz::RequestListCodec>("resnet50_stalled_rank2", stalled, corpus);
  ok &= AddSeed<fuzz::RequestListCodec>("bert_grouped_fp16", BertGroup(2), corpus);
  ok &= AddSeed<fuzz::RequestListCodec>("every_op_rank3", EveryOp(3), corpus);
  ok &= AddSeed<fuzz::RequestListCodec>("dtype_shape_sweep", DtypeAndShapeSweep(), corpus);
  ok &= AddSeed<fuzz::RequestListCodec>("unicode_name", unicode, corpus);
  const RequestList every_op = EveryOp(1);
  for (size_t i = 0; i < every_op.requests.size(); ++i) {
    const Request& q = every_op.requests[i];
    ok &= AddSeed<fuzz::RequestListCodec>("single_" + std::to_string(i) + "_" + OpTypeName(q.op),
                                          {{q}}, corpus);
  }
  return ok;
}

bool BuildResponseSeeds(Corpus* corpus) {
  ResponseList every_type = EveryOpResponses();
  every_type.responses.push_back(Agreed(ResNetStep(0, DataType::kFloat32, 0).requests[0]));
  every_type.responses.push_back(MismatchError());
  every_type.responses.push_back(StallShutdown());  // always last in its list

  bool ok = AddSeed<fuzz::ResponseListCodec>("empty", {}, corpus);
  ok &= AddSeed<fuzz::ResponseListCodec>("resnet50_step_fp32",
                                         AgreedList(ResNetStep(0, DataType::kFloat32, 0)), corpus);
  ok &= AddSeed<fuzz::ResponseListCodec>("bert_grouped_fp16", AgreedList(BertGroup(0)), corpus);
  ok &= AddSeed<fuzz::ResponseListCodec>("dtype_shape_sweep", AgreedList(DtypeAndShapeSweep()),
                                         corpus);
  ok &= AddSeed<fuzz::ResponseListCodec>("every_type", every_type, corpus);
  ok &= AddSeed<fuzz::ResponseListCodec>("dtype_mismatch_error", {{MismatchError()}}, corpus);
  ok &= AddSeed<fuzz::ResponseListCodec>("stall_shutdown", {{StallShutdown()}}, corpus);
  ok &= AddSeed<fuzz::ResponseListCodec>("joined_rank_round", JoinedRankRound(), corpus);
  for (size_t i = 0; i < every_type.responses.size(); ++i) {
    const Response& p = every_type.responses[i];
    const std::string name = "single_" + std::to_string(i) + "_" + ResponseTypeLabel(p.type);
    ok &= AddSeed<fuzz::ResponseListCodec>(name, {{p}}, corpus);
  }
  return ok;
}

// The enum values the seeds leave out, in words; empty when every one is used.
std::string MissingValues(const Corpus& requests, const Corpus& responses) {
  std::set<int> ops, types, dtypes, reduce_ops, devices;
  for (const auto& [name, bytes] : requests) {
    RequestList list;
    (void)ParseRequestList(bytes.data(), bytes.size(), &list);
    for (const Request& q : list.requests) {
      ops.insert(static_cast<int>(q.op));
      dtypes.insert(static_cast<int>(q.dtype));
      reduce_ops.insert(static_cast<int>(q.reduce_op));
      devices.insert(static_cast<int>(q.device.kind));
    }
  }
  for (const auto& [name, bytes] : responses) {
    ResponseList list;
    (void)ParseResponseList(bytes.data(), bytes.size(), &list);
    for (const Response& p : list.responses) types.insert(static_cast<int>(p.type));
  }
  std::string missing;
  auto check = [&](const char* what, const std::set<int>& seen, int count) {
    for (int v = 0; v < count; ++v) {
      if (seen.count(v) == 0) missing += std::string(" ") + what + "=" + std::to_string(v);
    }
  };
  check("op", ops, kNumOpTypes);
  check("response_type", types, kNumResponseTypes);
  check("dtype", dtypes, kNumDataTypes);
  check("reduce_op", reduce_ops, kNumReduceOps);
  check("device_kind", devices, static_cast<int>(DeviceKind::kCuda) + 1);
  return missing;
}

bool WriteCorpus(const fs::path& dir, const Corpus& corpus) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "wire_corpus_generator: cannot create %s: %s\n", dir.c_str(),
                 ec.message().c_str());
    return false;
  }
  for (const auto& [name, bytes] : corpus) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) {
      std::fprintf(stderr, "wire_corpus_generator: cannot write %s\n", (dir / name).c_str());
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  using gradsync::Corpus;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  Corpus requests, responses;
  if (!gradsync::BuildRequestSeeds(&requests) || !gradsync::BuildResponseSeeds(&responses)) {
    return 1;
  }
  const std::string missing = gradsync::MissingValues(requests, responses);
  if (!missing.empty()) {
    std::fprintf(stderr, "wire_corpus_generator: no seed uses%s\n", missing.c_str());
    return 1;
  }
  const std::filesystem::path out = argv[1];
  if (!gradsync::WriteCorpus(out / "request_list", requests) ||
      !gradsync::WriteCorpus(out / "response_list", responses)) {
    return 1;
  }
  std::printf("wire_corpus_generator: %zu request and %zu response seeds in %s\n", requests.size(),
              responses.size(), out.c_str());
  return 0;
}
