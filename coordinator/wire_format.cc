#include "coordinator/wire_format.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace gradsync {
namespace {

constexpr uint16_t kKindRequestList = 1;
constexpr uint16_t kKindResponseList = 2;

// Fixed bytes of one entry, everything but string bytes and dimensions. The parser uses them to
// reject an entry count that the remaining bytes cannot possibly hold before reserving memory.
constexpr size_t kRequestFixedBytes = 56;
constexpr size_t kResponseFixedBytes = 52;

// ---- Serialization
// -------------------------------------------------------------------------------

[[noreturn]] void DieUnserializable(const char* list_name, const std::string& name,
                                    const std::string& why) {
  const std::string shown = name.size() > 80 ? name.substr(0, 80) + "..." : name;
  std::fprintf(stderr, "gradsync: internal error: cannot serialize %s entry for tensor '%s': %s\n",
               list_name, shown.c_str(), why.c_str());
  std::abort();
}

// What enqueue accepts (TensorView::num_bytes): the byte count of the non-zero dimensions fits in
// int64, so that every rank can size the tensor and its slices without overflow.
bool SizeFits(DataType dtype, const std::vector<int64_t>& shape) {
  return TensorView(nullptr, dtype, shape).num_bytes() >= 0;
}

void CheckCommon(const char* list_name, const std::string& name, DataType dtype,
                 const std::vector<int64_t>& shape, const Device& device, ReduceOp reduce_op) {
  if (name.size() > kMaxWireNameBytes) {
    DieUnserializable(list_name, name,
                      "name is " + std::to_string(name.size()) + " bytes, over the limit of " +
                          std::to_string(kMaxWireNameBytes));
  }
  if (shape.size() > kMaxWireDims) {
    DieUnserializable(list_name, name,
                      std::to_string(shape.size()) + " dimensions, over the limit of " +
                          std::to_string(kMaxWireDims));
  }
  for (int64_t d : shape) {
    if (d < 0) DieUnserializable(list_name, name, "negative dimension " + std::to_string(d));
  }
  if (!IsValidDataType(dtype)) DieUnserializable(list_name, name, "invalid dtype");
  if (!SizeFits(dtype, shape)) DieUnserializable(list_name, name, "byte count overflows");
  if (static_cast<uint8_t>(device.kind) > static_cast<uint8_t>(DeviceKind::kCuda)) {
    DieUnserializable(list_name, name, "invalid device kind");
  }
  if (!IsValidReduceOp(reduce_op)) DieUnserializable(list_name, name, "invalid reduce op");
}

void CheckGroup(const char* list_name, const std::string& name, const std::string& group,
                int32_t group_size) {
  if (group.size() > kMaxWireNameBytes) DieUnserializable(list_name, name, "group name too long");
  if (group_size < 0) DieUnserializable(list_name, name, "negative group size");
}

void CheckRequest(const Request& r) {
  CheckCommon("request list", r.name, r.dtype, r.shape, r.device, r.reduce_op);
  CheckGroup("request list", r.name, r.group, r.group_size);
  if (static_cast<int>(r.op) >= kNumOpTypes)
    DieUnserializable("request list", r.name, "invalid op");
}

void CheckResponse(const Response& r) {
  CheckCommon("response list", r.name, r.dtype, r.shape, r.device, r.reduce_op);
  CheckGroup("response list", r.name, r.group, r.group_size);
  if (static_cast<int>(r.type) >= kNumResponseTypes) {
    DieUnserializable("response list", r.name, "invalid response type");
  }
  if (r.first_dims.size() > kMaxWireEntries) {
    DieUnserializable("response list", r.name, "too many first_dims");
  }
  for (int64_t d : r.first_dims) {
    if (d < 0)
      DieUnserializable("response list", r.name, "negative first dim " + std::to_string(d));
  }
}

// Bytes of `s` kept when it must fit in `max`: never splits a UTF-8 sequence, so the receiver's log
// line stays valid text.
size_t ClampedTextLength(const std::string& s, size_t max) {
  if (s.size() <= max) return s.size();
  size_t n = max;
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0u) == 0x80u) --n;
  return n;
}

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}

  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Put(v); }
  void U32(uint32_t v) { Put(v); }
  void I32(int32_t v) { Put(static_cast<uint32_t>(v)); }
  void I64(int64_t v) { Put(static_cast<uint64_t>(v)); }
  void F64(double v) {
    uint64_t bits = 0;
    static_assert(sizeof(bits) == sizeof(v), "double must be 64-bit IEEE 754");
    std::memcpy(&bits, &v, sizeof(bits));
    Put(bits);
  }
  void Bytes(const char* data, size_t n) {
    U32(static_cast<uint32_t>(n));
    out_->append(data, n);
  }
  void String(const std::string& s) { Bytes(s.data(), s.size()); }
  void Dims(const std::vector<int64_t>& dims) {
    U32(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) I64(d);
  }

 private:
  // Byte-wise shifts keep the format little-endian on any host; compilers turn this into one store.
  template <typename U>
  void Put(U v) {
    char b[sizeof(U)];
    for (size_t i = 0; i < sizeof(U); ++i) b[i] = static_cast<char>(v >> (8 * i));
    out_->append(b, sizeof(U));
  }

  std::string* out_;
};

// Writes the header into the 16 bytes reserved at the front of `out`, now that the payload after
// them is final.
void FinishMessage(uint16_t kind, std::string* out) {
  const size_t payload_bytes = out->size() - kWireHeaderBytes;
  if (payload_bytes > std::numeric_limits<uint32_t>::max()) {
    std::fprintf(stderr, "gradsync: internal error: %zu-byte control message payload\n",
                 payload_bytes);
    std::abort();
  }
  std::string header;
  header.reserve(kWireHeaderBytes);
  Writer w(&header);
  w.U32(kWireMagic);
  w.U16(kWireVersion);
  w.U16(kind);
  w.U32(static_cast<uint32_t>(payload_bytes));
  w.U32(Crc32(out->data() + kWireHeaderBytes, payload_bytes));
  out->replace(0, kWireHeaderBytes, header);
}

void WriteDevice(Writer* w, const Device& device) {
  w->U8(static_cast<uint8_t>(device.kind));
  w->I32(device.index);
}

// ---- Parsing
// -------------------------------------------------------------------------------------

const char* KindName(uint16_t kind) {
  switch (kind) {
    case kKindRequestList:
      return "request list";
    case kKindResponseList:
      return "response list";
  }
  return "unknown";
}

// Bounds-checked cursor over a peer's bytes. Every read checks what remains first, so a lying
// count or length turns into a CorruptMessage naming the field and byte offset, never an
// out-of-bounds read or a huge allocation.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const char* list_name)
      : data_(data), size_(size), list_name_(list_name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  void set_entry(int64_t entry) { entry_ = entry; }

  Status Fail(const std::string& what) const {
    std::string message = list_name_;
    if (entry_ >= 0) message += " entry " + std::to_string(entry_);
    return Status::CorruptMessage(message + ": " + what);
  }

  template <typename U>
  Status Read(const char* field, U* v) {
    if (remaining() < sizeof(U)) {
      return Fail("truncated at byte " + std::to_string(pos_) + " reading " + field + " (needs " +
                  std::to_string(sizeof(U)) + " bytes, " + std::to_string(remaining()) +
                  " remain)");
    }
    U x = 0;
    for (size_t i = 0; i < sizeof(U); ++i)
      x |= static_cast<U>(static_cast<U>(data_[pos_ + i]) << (8 * i));
    pos_ += sizeof(U);
    *v = x;
    return Status::OK();
  }

  Status I32(const char* field, int32_t* v) {
    uint32_t u = 0;
    GRADSYNC_RETURN_IF_ERROR(Read(field, &u));
    *v = static_cast<int32_t>(u);
    return Status::OK();
  }

  Status I64(const char* field, int64_t* v) {
    uint64_t u = 0;
    GRADSYNC_RETURN_IF_ERROR(Read(field, &u));
    *v = static_cast<int64_t>(u);
    return Status::OK();
  }

  Status F64(const char* field, double* v) {
    uint64_t bits = 0;
    GRADSYNC_RETURN_IF_ERROR(Read(field, &bits));
    std::memcpy(v, &bits, sizeof(bits));
    return Status::OK();
  }

  // A u32 count of items of at least `min_item_bytes` each, checked against `max` and against what
  // the remaining bytes could hold.
  Status Count(const char* field, uint32_t max, size_t min_item_bytes, uint32_t* n) {
    const size_t at = pos_;
    GRADSYNC_RETURN_IF_ERROR(Read(field, n));
    if (*n > max) {
      return Fail(std::string(field) + " " + std::to_string(*n) + " at byte " + std::to_string(at) +
                  " is over the limit of " + std::to_string(max));
    }
    if (min_item_bytes > 0 && *n > remaining() / min_item_bytes) {
      return Fail(std::string(field) + " " + std::to_string(*n) + " at byte " + std::to_string(at) +
                  " needs at least " + std::to_string(uint64_t{*n} * min_item_bytes) +
                  " bytes but only " + std::to_string(remaining()) + " remain");
    }
    return Status::OK();
  }

  Status String(const char* length_field, uint32_t max, std::string* s) {
    uint32_t n = 0;
    GRADSYNC_RETURN_IF_ERROR(Count(length_field, max, 1, &n));
    s->assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return Status::OK();
  }

  Status Dims(const char* count_field, const char* dim_field, uint32_t max,
              std::vector<int64_t>* dims) {
    uint32_t n = 0;
    GRADSYNC_RETURN_IF_ERROR(Count(count_field, max, sizeof(int64_t), &n));
    dims->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      const size_t at = pos_;
      GRADSYNC_RETURN_IF_ERROR(I64(dim_field, &(*dims)[i]));
      if ((*dims)[i] < 0) {
        return Fail("negative " + std::string(dim_field) + " " + std::to_string((*dims)[i]) +
                    " at byte " + std::to_string(at));
      }
    }
    return Status::OK();
  }

  // A u8 enum value, accepted only when `valid` says the enum defines it.
  template <typename E, typename Valid>
  Status Enum(const char* field, Valid valid, E* out) {
    const size_t at = pos_;
    uint8_t v = 0;
    GRADSYNC_RETURN_IF_ERROR(Read(field, &v));
    if (!valid(v)) {
      return Fail("invalid " + std::string(field) + " value " + std::to_string(v) + " at byte " +
                  std::to_string(at));
    }
    *out = static_cast<E>(v);
    return Status::OK();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const char* list_name_;
  int64_t entry_ = -1;  // the entry being parsed, for messages; -1 outside the entries
};

bool ValidOp(uint8_t v) { return v < kNumOpTypes; }
bool ValidResponseType(uint8_t v) { return v < kNumResponseTypes; }
bool ValidDataType(uint8_t v) { return IsValidDataType(static_cast<DataType>(v)); }
bool ValidReduceOp(uint8_t v) { return IsValidReduceOp(static_cast<ReduceOp>(v)); }
bool ValidDeviceKind(uint8_t v) { return v <= static_cast<uint8_t>(DeviceKind::kCuda); }

// Checks everything the header promises, leaving `r` at the first payload byte.
Status ReadHeader(const void* data, size_t size, uint16_t expected_kind, Reader* r) {
  if (data == nullptr && size > 0) return r->Fail("null data with a non-zero size");
  if (size < kWireHeaderBytes) {
    return r->Fail("message is " + std::to_string(size) + " bytes, shorter than the " +
                   std::to_string(kWireHeaderBytes) + "-byte header");
  }
  uint32_t magic = 0, payload_bytes = 0, crc = 0;
  uint16_t version = 0, kind = 0;
  GRADSYNC_RETURN_IF_ERROR(r->Read("magic", &magic));
  if (magic != kWireMagic) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "bad magic 0x%08X (expected 0x%08X)", magic, kWireMagic);
    return r->Fail(buf);
  }
  GRADSYNC_RETURN_IF_ERROR(r->Read("version", &version));
  if (version != kWireVersion) {
    return r->Fail("unsupported version " + std::to_string(version) + " (this build speaks " +
                   std::to_string(kWireVersion) + ")");
  }
  GRADSYNC_RETURN_IF_ERROR(r->Read("kind", &kind));
  if (kind != expected_kind) {
    return r->Fail("message kind " + std::to_string(kind) + " (" + KindName(kind) + ") where a " +
                   KindName(expected_kind) + " was expected");
  }
  GRADSYNC_RETURN_IF_ERROR(r->Read("payload length", &payload_bytes));
  GRADSYNC_RETURN_IF_ERROR(r->Read("crc", &crc));
  if (payload_bytes != r->remaining()) {
    return r->Fail("header says the payload is " + std::to_string(payload_bytes) + " bytes but " +
                   std::to_string(r->remaining()) + " follow the header");
  }
  const uint32_t actual =
      Crc32(static_cast<const uint8_t*>(data) + kWireHeaderBytes, payload_bytes);
  if (actual != crc) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "CRC mismatch: header says 0x%08X, payload has 0x%08X", crc,
                  actual);
    return r->Fail(buf);
  }
  return Status::OK();
}

Status ReadDevice(Reader* r, Device* device) {
  GRADSYNC_RETURN_IF_ERROR(r->Enum("device kind", ValidDeviceKind, &device->kind));
  int32_t index = 0;
  GRADSYNC_RETURN_IF_ERROR(r->I32("device index", &index));
  device->index = index;
  return Status::OK();
}

Status ReadRequest(Reader* r, Request* q) {
  GRADSYNC_RETURN_IF_ERROR(r->String("name length", kMaxWireNameBytes, &q->name));
  GRADSYNC_RETURN_IF_ERROR(r->Enum("op", ValidOp, &q->op));
  GRADSYNC_RETURN_IF_ERROR(r->Enum("dtype", ValidDataType, &q->dtype));
  GRADSYNC_RETURN_IF_ERROR(r->Dims("shape ndims", "shape dim", kMaxWireDims, &q->shape));
  if (!SizeFits(q->dtype, q->shape)) return r->Fail("a shape whose byte count overflows int64");
  GRADSYNC_RETURN_IF_ERROR(ReadDevice(r, &q->device));
  GRADSYNC_RETURN_IF_ERROR(r->Enum("reduce op", ValidReduceOp, &q->reduce_op));
  GRADSYNC_RETURN_IF_ERROR(r->F64("prescale", &q->prescale));
  GRADSYNC_RETURN_IF_ERROR(r->F64("postscale", &q->postscale));
  GRADSYNC_RETURN_IF_ERROR(r->I32("root", &q->root));
  GRADSYNC_RETURN_IF_ERROR(r->I32("rank", &q->rank));
  GRADSYNC_RETURN_IF_ERROR(r->F64("waited seconds", &q->waited_seconds));
  GRADSYNC_RETURN_IF_ERROR(r->String("group length", kMaxWireNameBytes, &q->group));
  GRADSYNC_RETURN_IF_ERROR(r->I32("group size", &q->group_size));
  if (q->group_size < 0) return r->Fail("negative group size " + std::to_string(q->group_size));
  return Status::OK();
}

Status ReadResponse(Reader* r, Response* p) {
  GRADSYNC_RETURN_IF_ERROR(r->Enum("response type", ValidResponseType, &p->type));
  GRADSYNC_RETURN_IF_ERROR(r->String("name length", kMaxWireNameBytes, &p->name));
  GRADSYNC_RETURN_IF_ERROR(r->Enum("dtype", ValidDataType, &p->dtype));
  GRADSYNC_RETURN_IF_ERROR(r->Dims("shape ndims", "shape dim", kMaxWireDims, &p->shape));
  if (!SizeFits(p->dtype, p->shape)) return r->Fail("a shape whose byte count overflows int64");
  GRADSYNC_RETURN_IF_ERROR(ReadDevice(r, &p->device));
  GRADSYNC_RETURN_IF_ERROR(r->Enum("reduce op", ValidReduceOp, &p->reduce_op));
  GRADSYNC_RETURN_IF_ERROR(r->F64("prescale", &p->prescale));
  GRADSYNC_RETURN_IF_ERROR(r->F64("postscale", &p->postscale));
  GRADSYNC_RETURN_IF_ERROR(r->I32("root", &p->root));
  GRADSYNC_RETURN_IF_ERROR(
      r->Dims("first_dims count", "first dim", kMaxWireEntries, &p->first_dims));
  GRADSYNC_RETURN_IF_ERROR(r->String("error length", kMaxWireErrorBytes, &p->error));
  GRADSYNC_RETURN_IF_ERROR(r->String("group length", kMaxWireNameBytes, &p->group));
  GRADSYNC_RETURN_IF_ERROR(r->I32("group size", &p->group_size));
  if (p->group_size < 0) return r->Fail("negative group size " + std::to_string(p->group_size));
  return Status::OK();
}

// Shared frame of both list kinds: header, entry count, entries, nothing after them. The result
// replaces *out only when the whole message is valid.
template <typename Entry, typename ReadEntry>
Status ParseList(const void* data, size_t size, uint16_t kind, size_t min_entry_bytes,
                 ReadEntry read_entry, std::vector<Entry>* out) {
  Reader r(static_cast<const uint8_t*>(data), size, KindName(kind));
  GRADSYNC_RETURN_IF_ERROR(ReadHeader(data, size, kind, &r));
  uint32_t count = 0;
  GRADSYNC_RETURN_IF_ERROR(r.Count("entry count", kMaxWireEntries, min_entry_bytes, &count));
  std::vector<Entry> entries(count);
  for (uint32_t i = 0; i < count; ++i) {
    r.set_entry(i);
    GRADSYNC_RETURN_IF_ERROR(read_entry(&r, &entries[i]));
  }
  r.set_entry(-1);
  if (r.remaining() != 0) {
    return r.Fail(std::to_string(r.remaining()) + " trailing bytes after the last entry, at byte " +
                  std::to_string(r.pos()));
  }
  *out = std::move(entries);
  return Status::OK();
}

}  // namespace

std::string SerializeRequestList(const RequestList& list) {
  if (list.requests.size() > kMaxWireEntries) {
    std::fprintf(stderr, "gradsync: internal error: %zu requests in one message\n",
                 list.requests.size());
    std::abort();
  }
  size_t bytes = kWireHeaderBytes + 4;
  for (const Request& q : list.requests) {
    CheckRequest(q);
    bytes += kRequestFixedBytes + q.name.size() + q.group.size() + 8 * q.shape.size();
  }
  std::string out;
  out.reserve(bytes);
  out.resize(kWireHeaderBytes);
  Writer w(&out);
  w.U32(static_cast<uint32_t>(list.requests.size()));
  for (const Request& q : list.requests) {
    w.String(q.name);
    w.U8(static_cast<uint8_t>(q.op));
    w.U8(static_cast<uint8_t>(q.dtype));
    w.Dims(q.shape);
    WriteDevice(&w, q.device);
    w.U8(static_cast<uint8_t>(q.reduce_op));
    w.F64(q.prescale);
    w.F64(q.postscale);
    w.I32(q.root);
    w.I32(q.rank);
    w.F64(q.waited_seconds);
    w.String(q.group);
    w.I32(q.group_size);
  }
  FinishMessage(kKindRequestList, &out);
  return out;
}

std::string SerializeResponseList(const ResponseList& list) {
  if (list.responses.size() > kMaxWireEntries) {
    std::fprintf(stderr, "gradsync: internal error: %zu responses in one message\n",
                 list.responses.size());
    std::abort();
  }
  size_t bytes = kWireHeaderBytes + 4;
  for (const Response& p : list.responses) {
    CheckResponse(p);
    bytes += kResponseFixedBytes + p.name.size() + p.group.size() +
             8 * (p.shape.size() + p.first_dims.size()) +
             ClampedTextLength(p.error, kMaxWireErrorBytes);
  }
  std::string out;
  out.reserve(bytes);
  out.resize(kWireHeaderBytes);
  Writer w(&out);
  w.U32(static_cast<uint32_t>(list.responses.size()));
  for (const Response& p : list.responses) {
    w.U8(static_cast<uint8_t>(p.type));
    w.String(p.name);
    w.U8(static_cast<uint8_t>(p.dtype));
    w.Dims(p.shape);
    WriteDevice(&w, p.device);
    w.U8(static_cast<uint8_t>(p.reduce_op));
    w.F64(p.prescale);
    w.F64(p.postscale);
    w.I32(p.root);
    w.Dims(p.first_dims);
    w.Bytes(p.error.data(), ClampedTextLength(p.error, kMaxWireErrorBytes));
    w.String(p.group);
    w.I32(p.group_size);
  }
  FinishMessage(kKindResponseList, &out);
  return out;
}

Status ParseRequestList(const void* data, size_t size, RequestList* out) {
  if (out == nullptr) return Status::InvalidArgument("request list: null output");
  return ParseList(data, size, kKindRequestList, kRequestFixedBytes, ReadRequest, &out->requests);
}

Status ParseResponseList(const void* data, size_t size, ResponseList* out) {
  if (out == nullptr) return Status::InvalidArgument("response list: null output");
  return ParseList(data, size, kKindResponseList, kResponseFixedBytes, ReadResponse,
                   &out->responses);
}

}  // namespace gradsync
