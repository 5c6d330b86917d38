#include "runtime/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace gradsync {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// A strict JSON parser (RFC 8259), so the tests check the file as a viewer would read it rather
// than by string matching.

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> items;        // array elements, or object member values
  std::vector<std::string> keys;  // object member names, parallel to `items`

  Json* Find(std::string_view key) {
    if (type != Type::kObject) return nullptr;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return &items[i];
    }
    return nullptr;
  }
  const Json* Find(std::string_view key) const { return const_cast<Json*>(this)->Find(key); }
};

class JsonParser {
 public:
  // Parses the whole of `text`; on failure returns false and says what and where in *error.
  static bool Parse(std::string_view text, Json* out, std::string* error) {
    JsonParser parser(text);
    bool ok = parser.ParseValue(out, 0);
    if (ok) {
      parser.SkipSpace();
      if (parser.pos_ != text.size()) ok = parser.Fail("trailing characters");
    }
    if (!ok) *error = parser.error_;
    return ok;
  }

 private:
  static constexpr int kMaxDepth = 64;

  explicit JsonParser(std::string_view text) : text_(text) {}

  bool Fail(const std::string& what) {
    if (error_.empty()) error_ = what + " at offset " + std::to_string(pos_);
    return false;
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  void SkipSpace() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r')) {
      ++pos_;
    }
  }
  bool Expect(char c) {
    if (Peek() != c || AtEnd()) return Fail(std::string("expected '") + c + "'");
    ++pos_;
    return true;
  }

  bool ParseValue(Json* out, int depth) {
    if (depth > kMaxDepth) return Fail("nesting too deep");
    SkipSpace();
    if (AtEnd()) return Fail("unexpected end");
    switch (Peek()) {
      case '{':
        return ParseObject(out, depth);
      case '[':
        return ParseArray(out, depth);
      case '"':
        out->type = Json::Type::kString;
        return ParseString(&out->string);
      case 't':
        out->type = Json::Type::kBool;
        out->boolean = true;
        return ParseLiteral("true");
      case 'f':
        out->type = Json::Type::kBool;
        out->boolean = false;
        return ParseLiteral("false");
      case 'n':
        out->type = Json::Type::kNull;
        return ParseLiteral("null");
      default:
        out->type = Json::Type::kNumber;
        return ParseNumber(&out->number);
    }
  }

  bool ParseLiteral(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return Fail("bad literal");
    pos_ += word.size();
    return true;
  }

  bool ParseObject(Json* out, int depth) {
    out->type = Json::Type::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Peek() == '}') {
      ++pos_;
      return true;
    }
    for (;;) {
      SkipSpace();
      if (Peek() != '"') return Fail("expected a member name");
      std::string key;
      if (!ParseString(&key)) return false;
      SkipSpace();
      if (!Expect(':')) return false;
      Json value;
      if (!ParseValue(&value, depth + 1)) return false;
      out->keys.push_back(std::move(key));
      out->items.push_back(std::move(value));
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      return Expect('}');
    }
  }

  bool ParseArray(Json* out, int depth) {
    out->type = Json::Type::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Peek() == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      Json value;
      if (!ParseValue(&value, depth + 1)) return false;
      out->items.push_back(std::move(value));
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      return Expect(']');
    }
  }

  bool ParseHex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Fail("short \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        value |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        value |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Fail("bad hex digit in \\u escape");
      }
    }
    *out = value;
    return true;
  }

  static void AppendUtf8(uint32_t code_point, std::string* out) {
    if (code_point < 0x80) {
      out->push_back(static_cast<char>(code_point));
    } else if (code_point < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
      out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
    } else if (code_point < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
    }
  }

  bool ParseEscape(std::string* out) {
    if (AtEnd()) return Fail("unterminated escape");
    const char c = text_[pos_++];
    switch (c) {
      case '"':
      case '\\':
      case '/':
        out->push_back(c);
        return true;
      case 'b':
        out->push_back('\b');
        return true;
      case 'f':
        out->push_back('\f');
        return true;
      case 'n':
        out->push_back('\n');
        return true;
      case 'r':
        out->push_back('\r');
        return true;
      case 't':
        out->push_back('\t');
        return true;
      case 'u':
        break;
      default:
        return Fail("bad escape");
    }
    uint32_t unit = 0;
    if (!ParseHex4(&unit)) return false;
    if (unit >= 0xDC00 && unit <= 0xDFFF) return Fail("lone low surrogate");
    if (unit >= 0xD800 && unit <= 0xDBFF) {
      uint32_t low = 0;
      if (text_.substr(pos_, 2) != "\\u") return Fail("high surrogate without a low one");
      pos_ += 2;
      if (!ParseHex4(&low)) return false;
      if (low < 0xDC00 || low > 0xDFFF) return Fail("high surrogate without a low one");
      unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
    }
    AppendUtf8(unit, out);
    return true;
  }

  // Raw bytes must be well-formed UTF-8 (the file is read as UTF-8 text).
  bool ParseRawUtf8(std::string* out) {
    auto byte = [this](size_t k) -> unsigned {
      return k < text_.size() ? static_cast<unsigned char>(text_[k]) : 0u;
    };
    const unsigned lead = byte(pos_);
    size_t length = 0;
    uint32_t code_point = 0;
    if (lead >= 0xC0 && lead < 0xE0) {
      length = 2;
      code_point = lead & 0x1F;
    } else if (lead >= 0xE0 && lead < 0xF0) {
      length = 3;
      code_point = lead & 0x0F;
    } else if (lead >= 0xF0 && lead < 0xF8) {
      length = 4;
      code_point = lead & 0x07;
    } else {
      return Fail("invalid UTF-8 lead byte");
    }
    for (size_t k = 1; k < length; ++k) {
      const unsigned next = byte(pos_ + k);
      if ((next & 0xC0) != 0x80) return Fail("invalid UTF-8 continuation byte");
      code_point = (code_point << 6) | (next & 0x3F);
    }
    static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code_point < kMinForLength[length]) return Fail("overlong UTF-8");
    if (code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return Fail("UTF-8 outside Unicode scalar values");
    }
    out->append(text_.substr(pos_, length));
    pos_ += length;
    return true;
  }

  bool ParseString(std::string* out) {
    ++pos_;  // opening quote
    for (;;) {
      if (AtEnd()) return Fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c == '\\') {
        ++pos_;
        if (!ParseEscape(out)) return false;
      } else if (c < 0x20) {
        return Fail("raw control character in string");
      } else if (c < 0x80) {
        out->push_back(static_cast<char>(c));
        ++pos_;
      } else if (!ParseRawUtf8(out)) {
        return false;
      }
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool ParseNumber(double* out) {
    const size_t begin = pos_;
    auto digit = [this] { return Peek() >= '0' && Peek() <= '9'; };
    auto digits = [&] {
      if (!digit()) return false;
      while (digit()) ++pos_;
      return true;
    };
    if (Peek() == '-') ++pos_;
    if (Peek() == '0') {
      ++pos_;
    } else if (!digits()) {
      return Fail("bad value");
    }
    if (Peek() == '.') {
      ++pos_;
      if (!digits()) return Fail("bad fraction");
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (!digits()) return Fail("bad exponent");
    }
    *out = std::strtod(std::string(text_.substr(begin, pos_ - begin)).c_str(), nullptr);
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

// ---------------------------------------------------------------------------------------------
// Reading a trace back.

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::string StringField(const Json& object, std::string_view key) {
  const Json* field = object.Find(key);
  return field != nullptr && field->type == Json::Type::kString ? field->string : std::string();
}

// -1 when absent or not a number.
int64_t IntField(const Json& object, std::string_view key) {
  const Json* field = object.Find(key);
  return field != nullptr && field->type == Json::Type::kNumber
             ? static_cast<int64_t>(field->number)
             : -1;
}

struct Trace {
  bool ok = false;
  std::vector<Json> events;             // in file order
  std::map<int64_t, std::string> rows;  // tid -> tensor name, from "thread_name" metadata

  int64_t RowOf(const std::string& name) const {
    for (const auto& [tid, row_name] : rows) {
      if (row_name == name) return tid;
    }
    return -1;
  }

  // The row's non-metadata events in file order: "B <name>", "E", "i <name> <rank>".
  std::vector<std::string> Sequence(int64_t tid) const {
    std::vector<std::string> sequence;
    for (const Json& event : events) {
      const std::string ph = StringField(event, "ph");
      if (ph == "M" || IntField(event, "tid") != tid) continue;
      std::string entry = ph;
      if (ph != "E") entry += " " + StringField(event, "name");
      const Json* args = event.Find("args");
      if (ph == "i" && args != nullptr) entry += " " + std::to_string(IntField(*args, "rank"));
      sequence.push_back(entry);
    }
    return sequence;
  }

  size_t Count(const std::string& ph, const std::string& name = "") const {
    size_t count = 0;
    for (const Json& event : events) {
      if (StringField(event, "ph") == ph && (name.empty() || StringField(event, "name") == name)) {
        ++count;
      }
    }
    return count;
  }

  int64_t Dropped() const {
    for (const Json& event : events) {
      const Json* args = event.Find("args");
      if (StringField(event, "name") == "TIMELINE_DROPPED_EVENTS" && args != nullptr) {
        return IntField(*args, "dropped_events");
      }
    }
    return 0;
  }
};

// Parses the file and checks what every trace must satisfy: the object form with "ms", events
// with the required fields, one name per row given before the row is used, timestamps in file
// order never decreasing, and B/E nesting that never closes more than it opened per row.
Trace LoadTrace(const fs::path& path) {
  Trace trace;
  const std::string text = ReadFile(path);
  Json doc;
  std::string error;
  if (!JsonParser::Parse(text, &doc, &error)) {
    ADD_FAILURE() << path << " is not valid JSON: " << error;
    return trace;
  }
  if (doc.type != Json::Type::kObject || StringField(doc, "displayTimeUnit") != "ms") {
    ADD_FAILURE() << path << ": expected an object with \"displayTimeUnit\":\"ms\"";
    return trace;
  }
  Json* events = doc.Find("traceEvents");
  if (events == nullptr || events->type != Json::Type::kArray) {
    ADD_FAILURE() << path << ": no traceEvents array";
    return trace;
  }
  trace.events = std::move(events->items);

  int64_t last_ts = 0;
  std::map<int64_t, int> depth;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const Json& event = trace.events[i];
    const std::string ph = StringField(event, "ph");
    const int64_t tid = IntField(event, "tid");
    if (event.type != Json::Type::kObject || IntField(event, "pid") != 0 || tid < 0) {
      ADD_FAILURE() << "event " << i << " lacks pid 0 or a tid";
      return trace;
    }
    if (ph == "M") {
      if (StringField(event, "name") == "thread_name") {
        const Json* args = event.Find("args");
        const std::string name = args == nullptr ? "" : StringField(*args, "name");
        if (!trace.rows.emplace(tid, name).second || tid == 0) {
          ADD_FAILURE() << "row " << tid << " named twice or row 0 named";
          return trace;
        }
      }
      continue;
    }
    const int64_t ts = IntField(event, "ts");
    if (ts < last_ts) {
      ADD_FAILURE() << "event " << i << " goes back in time: " << ts << " < " << last_ts;
      return trace;
    }
    last_ts = ts;
    if (ph == "i" && StringField(event, "s") == "g") continue;  // global: not on a tensor row
    if (trace.rows.count(tid) == 0) {
      ADD_FAILURE() << "event " << i << " on row " << tid << " before the row's name";
      return trace;
    }
    if (ph == "B") ++depth[tid];
    if (ph == "E" && --depth[tid] < 0) {
      ADD_FAILURE() << "event " << i << ": E without an open B on row " << tid;
      return trace;
    }
    if (ph != "B" && ph != "E" && ph != "i") {
      ADD_FAILURE() << "event " << i << ": unexpected phase '" << ph << "'";
      return trace;
    }
  }
  trace.ok = true;
  return trace;
}

// Every B on every row was closed.
void ExpectAllClosed(const Trace& trace) {
  for (const auto& [tid, name] : trace.rows) {
    int depth = 0;
    for (const std::string& entry : trace.Sequence(tid)) {
      if (entry[0] == 'B') ++depth;
      if (entry[0] == 'E') --depth;
    }
    EXPECT_EQ(depth, 0) << "row " << name;
  }
}

// ---------------------------------------------------------------------------------------------

class TimelineTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const fs::path& path : paths_) {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
  }

  // A fresh path under the system temp dir, removed after the test.
  fs::path TempPath(const std::string& tag) {
    static std::atomic<int> counter{0};
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::path path =
        fs::temp_directory_path() / ("gradsync_timeline_" + std::to_string(::getpid()) + "_" +
                                     test + "_" + std::to_string(counter++) + "_" + tag + ".json");
    paths_.push_back(path);
    return path;
  }

  // Records a whole allreduce of `name` as the background thread would.
  static void RecordAllreduce(Timeline* timeline, const std::string& name, int ranks) {
    timeline->NegotiateStart(name, "ALLREDUCE");
    for (int rank = 0; rank < ranks; ++rank) timeline->RankReady(name, rank);
    timeline->NegotiateEnd(name);
    timeline->ActivityStart(name, "MPI_ALLREDUCE");
    timeline->ActivityEnd(name);
  }

  std::vector<fs::path> paths_;
};

const std::vector<std::string> kAllreduceSequence = {
    "B NEGOTIATE_ALLREDUCE", "i RANK_READY 0", "i RANK_READY 1", "E", "B MPI_ALLREDUCE", "E"};

TEST_F(TimelineTest, RecordsEachTensorOnItsOwnRow) {
  const std::string odd = std::string("say \"hi\"\\C:\\path\nnext\x01\t") + "caf\xc3\xa9";
  const std::vector<std::string> names = {"layer1/weight", "layer1/bias", odd};
  const fs::path path = TempPath("trace");
  Timeline timeline;
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  EXPECT_TRUE(timeline.active());

  // Interleaved across tensors, as a cycle does: rows must keep each tensor's events apart.
  timeline.CycleMark();
  for (const auto& name : names) timeline.NegotiateStart(name, "ALLREDUCE");
  for (int rank : {1, 0}) {
    for (const auto& name : names) timeline.RankReady(name, rank);
  }
  for (const auto& name : names) timeline.NegotiateEnd(name);
  timeline.CycleMark();
  for (const auto& name : names) timeline.ActivityStart(name, "QUEUE");
  for (const auto& name : names) timeline.ActivityEnd(name);
  for (const char* phase :
       {"MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"}) {
    for (const auto& name : names) timeline.ActivityStart(name, phase);
    for (const auto& name : names) timeline.ActivityEnd(name);
  }
  ASSERT_TRUE(timeline.Stop().ok());
  EXPECT_FALSE(timeline.active());

  const std::string text = ReadFile(path);
  EXPECT_NE(text.find(R"("say \"hi\"\\C:\\path\u000anext\u0001\u0009caf)"), std::string::npos)
      << text;
  const Trace trace = LoadTrace(path);
  ASSERT_TRUE(trace.ok);

  ASSERT_EQ(trace.rows.size(), names.size());
  std::set<int64_t> tids;
  for (const auto& name : names) {
    const int64_t tid = trace.RowOf(name);
    ASSERT_GT(tid, 0) << name;
    tids.insert(tid);
    const std::vector<std::string> expected = {"B NEGOTIATE_ALLREDUCE",
                                               "i RANK_READY 1",
                                               "i RANK_READY 0",
                                               "E",
                                               "B QUEUE",
                                               "E",
                                               "B MEMCPY_IN_FUSION_BUFFER",
                                               "E",
                                               "B MPI_ALLREDUCE",
                                               "E",
                                               "B MEMCPY_OUT_FUSION_BUFFER",
                                               "E"};
    EXPECT_EQ(trace.Sequence(tid), expected) << name;
  }
  EXPECT_EQ(tids.size(), names.size());  // one row each

  EXPECT_EQ(trace.Count("M", "process_name"), 1u);
  EXPECT_EQ(trace.Count("M", "thread_name"), names.size());
  EXPECT_EQ(trace.Count("M", "thread_sort_index"), names.size());
  EXPECT_EQ(trace.Count("i", "RANK_READY"), 2 * names.size());
  EXPECT_EQ(trace.Count("i", "CYCLE_START"), 2u);
  for (const Json& event : trace.events) {
    const std::string name = StringField(event, "name");
    if (name == "CYCLE_START") {
      EXPECT_EQ(StringField(event, "s"), "g");
    } else if (name == "RANK_READY") {
      EXPECT_EQ(StringField(event, "s"), "t");
    }
  }
  // The first cycle marker comes before any tensor event, the second after every negotiation.
  std::vector<std::string> order;
  for (const Json& event : trace.events) {
    const std::string ph = StringField(event, "ph");
    if (ph != "M") order.push_back(ph + " " + StringField(event, "name"));
  }
  EXPECT_EQ(order.front(), "i CYCLE_START");
  ASSERT_GT(order.size(), 1 + 4 * names.size());
  EXPECT_EQ(order[1 + 4 * names.size()], "i CYCLE_START");
  ExpectAllClosed(trace);
}

TEST_F(TimelineTest, EscapesAnyBytesInANameIntoValidJson) {
  std::string name;
  for (int c = 0; c < 0x20; ++c) name.push_back(static_cast<char>(c));
  name += "\"\\/\x7f";
  name += "\xe2\x82\xac";      // U+20AC, kept
  name += "\xff";              // never valid
  name += "\xc0\xaf";          // overlong '/'
  name += "\xed\xa0\x80";      // a surrogate
  name += "\xf0\x9f\x98\x80";  // U+1F600, kept
  name += "\xe2\x82";          // truncated at the end
  const std::string kReplacement = "\xef\xbf\xbd";
  std::string expected = name.substr(0, 0x20) + "\"\\/\x7f" + "\xe2\x82\xac";
  for (int i = 0; i < 1 + 2 + 3; ++i) expected += kReplacement;
  expected += "\xf0\x9f\x98\x80" + kReplacement + kReplacement;

  const fs::path path = TempPath("escapes");
  Timeline timeline;
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  timeline.ActivityStart(name, "label \"quoted\"\n");
  timeline.ActivityEnd(name);
  ASSERT_TRUE(timeline.Stop().ok());

  const std::string text = ReadFile(path);
  EXPECT_NE(text.find(R"("\u0000\u0001)"), std::string::npos);
  EXPECT_NE(text.find(R"(\u001f\"\\/)"), std::string::npos);
  const Trace trace = LoadTrace(path);
  ASSERT_TRUE(trace.ok);
  ASSERT_EQ(trace.rows.size(), 1u);
  EXPECT_EQ(trace.rows.begin()->second, expected);
  EXPECT_EQ(trace.Sequence(trace.rows.begin()->first),
            (std::vector<std::string>{"B label \"quoted\"\n", "E"}));
}

TEST_F(TimelineTest, StopWithoutStartIsHarmless) {
  Timeline timeline;
  EXPECT_FALSE(timeline.active());
  EXPECT_TRUE(timeline.Stop().ok());
  EXPECT_TRUE(timeline.Stop().ok());
  timeline.CycleMark();
  RecordAllreduce(&timeline, "never.written", 2);
  EXPECT_FALSE(timeline.active());
}

TEST_F(TimelineTest, StopIsIdempotentAndTheDestructorFinishesTheFile) {
  const fs::path stopped = TempPath("stopped");
  const fs::path destroyed = TempPath("destroyed");
  {
    Timeline timeline;
    ASSERT_TRUE(timeline.Start(stopped.string()).ok());
    RecordAllreduce(&timeline, "a", 2);
    EXPECT_TRUE(timeline.Stop().ok());
    EXPECT_TRUE(timeline.Stop().ok());
  }
  {
    Timeline timeline;
    ASSERT_TRUE(timeline.Start(destroyed.string()).ok());
    RecordAllreduce(&timeline, "b", 2);
  }
  const Trace first = LoadTrace(stopped);
  ASSERT_TRUE(first.ok);
  EXPECT_EQ(first.Sequence(first.RowOf("a")), kAllreduceSequence);
  const Trace second = LoadTrace(destroyed);
  ASSERT_TRUE(second.ok);
  EXPECT_EQ(second.Sequence(second.RowOf("b")), kAllreduceSequence);
}

TEST_F(TimelineTest, StartFailsOnAnUnwritablePathAndNamesIt) {
  const fs::path missing_dir = TempPath("no_such_dir");
  const fs::path path = missing_dir / "trace.json";
  Timeline timeline;
  Status status = timeline.Start(path.string());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find(path.string()), std::string::npos) << status.message();
  EXPECT_NE(status.message().find(std::generic_category().message(ENOENT)), std::string::npos)
      << status.message();
  EXPECT_FALSE(timeline.active());
  EXPECT_FALSE(fs::exists(missing_dir));
  EXPECT_TRUE(timeline.Stop().ok());

  // The failure leaves the timeline usable.
  const fs::path good = TempPath("good");
  ASSERT_TRUE(timeline.Start(good.string()).ok());
  RecordAllreduce(&timeline, "t", 2);
  ASSERT_TRUE(timeline.Stop().ok());
  EXPECT_TRUE(LoadTrace(good).ok);
}

TEST_F(TimelineTest, StartWhileStartedFailsAndKeepsTheFirstFile) {
  const fs::path first = TempPath("first");
  const fs::path second = TempPath("second");
  Timeline timeline;
  ASSERT_TRUE(timeline.Start(first.string()).ok());
  Status status = timeline.Start(second.string());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(first.string()), std::string::npos) << status.message();
  EXPECT_FALSE(fs::exists(second));
  EXPECT_TRUE(timeline.active());
  RecordAllreduce(&timeline, "t", 2);
  ASSERT_TRUE(timeline.Stop().ok());
  const Trace trace = LoadTrace(first);
  ASSERT_TRUE(trace.ok);
  EXPECT_EQ(trace.Sequence(trace.RowOf("t")), kAllreduceSequence);
}

TEST_F(TimelineTest, StartStopStartWritesTwoValidFiles) {
  const fs::path first = TempPath("first");
  const fs::path second = TempPath("second");
  Timeline timeline;
  ASSERT_TRUE(timeline.Start(first.string()).ok());
  RecordAllreduce(&timeline, "shared", 2);
  RecordAllreduce(&timeline, "only.first", 2);
  ASSERT_TRUE(timeline.Stop().ok());
  ASSERT_TRUE(timeline.Start(second.string()).ok());
  RecordAllreduce(&timeline, "shared", 2);
  RecordAllreduce(&timeline, "only.second", 2);
  ASSERT_TRUE(timeline.Stop().ok());

  const Trace a = LoadTrace(first);
  const Trace b = LoadTrace(second);
  ASSERT_TRUE(a.ok);
  ASSERT_TRUE(b.ok);
  EXPECT_EQ(a.rows, (std::map<int64_t, std::string>{{1, "shared"}, {2, "only.first"}}));
  // Rows start afresh: the second file names every row it uses, "shared" included.
  EXPECT_EQ(b.rows, (std::map<int64_t, std::string>{{1, "shared"}, {2, "only.second"}}));
  for (const Trace* trace : {&a, &b}) {
    for (const auto& [tid, name] : trace->rows) {
      EXPECT_EQ(trace->Sequence(tid), kAllreduceSequence) << name;
    }
  }
}

TEST_F(TimelineTest, RecordingWhileInactiveWritesNothing) {
  const fs::path path = TempPath("inactive");
  Timeline timeline;
  timeline.CycleMark();
  RecordAllreduce(&timeline, "before", 2);
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  timeline.CycleMark();
  RecordAllreduce(&timeline, "during", 2);
  ASSERT_TRUE(timeline.Stop().ok());
  const std::string written = ReadFile(path);
  timeline.CycleMark();
  RecordAllreduce(&timeline, "after", 2);
  ASSERT_TRUE(timeline.Stop().ok());
  EXPECT_EQ(ReadFile(path), written);

  const Trace trace = LoadTrace(path);
  ASSERT_TRUE(trace.ok);
  EXPECT_EQ(trace.rows, (std::map<int64_t, std::string>{{1, "during"}}));
  EXPECT_EQ(trace.Sequence(1), kAllreduceSequence);
  EXPECT_EQ(trace.Count("i", "CYCLE_START"), 1u);
}

TEST_F(TimelineTest, ManyEventsWhileTheWriterRunsAreAllWritten) {
  constexpr int kTensors = 10;
  constexpr int kPairs = 50000;  // 100k events
  const fs::path path = TempPath("many");
  Timeline timeline;
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  const auto header_size = fs::file_size(path);
  std::vector<std::string> names;
  for (int t = 0; t < kTensors; ++t) names.push_back("model/layer" + std::to_string(t) + "/grad");
  for (int i = 0; i < kPairs; ++i) {
    const std::string& name = names[i % kTensors];
    timeline.ActivityStart(name, "MPI_ALLREDUCE");
    timeline.ActivityEnd(name);
  }
  // The writer drains on its own, without waiting for Stop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (fs::file_size(path) == header_size && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(fs::file_size(path), header_size);
  ASSERT_TRUE(timeline.Stop().ok());

  const Trace trace = LoadTrace(path);
  ASSERT_TRUE(trace.ok);
  EXPECT_EQ(trace.Dropped(), 0);
  EXPECT_EQ(trace.rows.size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(trace.Count("B", "MPI_ALLREDUCE"), static_cast<size_t>(kPairs));
  EXPECT_EQ(trace.Count("E"), static_cast<size_t>(kPairs));
  for (const auto& [tid, name] : trace.rows) {
    EXPECT_EQ(trace.Sequence(tid).size(), 2u * kPairs / kTensors) << name;
  }
  ExpectAllClosed(trace);
}

TEST_F(TimelineTest, RecordingFromSeveralThreadsKeepsEachRowInOrder) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  const fs::path path = TempPath("threads");
  Timeline timeline;
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&timeline, t] {
      const std::string name = "thread" + std::to_string(t);
      for (int i = 0; i < kRounds; ++i) {
        RecordAllreduce(&timeline, name, 2);
        if (i % 100 == 0) timeline.CycleMark();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(timeline.Stop().ok());

  const Trace trace = LoadTrace(path);
  ASSERT_TRUE(trace.ok);
  ASSERT_EQ(trace.rows.size(), static_cast<size_t>(kThreads));
  for (const auto& [tid, name] : trace.rows) {
    const std::vector<std::string> sequence = trace.Sequence(tid);
    ASSERT_EQ(sequence.size(), kRounds * kAllreduceSequence.size()) << name;
    for (size_t i = 0; i < sequence.size(); ++i) {
      ASSERT_EQ(sequence[i], kAllreduceSequence[i % kAllreduceSequence.size()]) << name << " " << i;
    }
  }
  EXPECT_EQ(trace.Count("i", "CYCLE_START"), static_cast<size_t>(kThreads * kRounds / 100));
}

TEST_F(TimelineTest, DropsRecordsBeyondTheBoundAndCountsThem) {
  constexpr int kPairs = 5000;
  const fs::path path = TempPath("bounded");
  Timeline timeline(/*max_pending_events=*/16);
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  for (int i = 0; i < kPairs; ++i) {
    timeline.ActivityStart("t", "QUEUE");
    timeline.ActivityEnd("t");
  }
  ASSERT_TRUE(timeline.Stop().ok());

  // A dropped B can leave an unmatched E, so this trace skips LoadTrace's nesting check.
  std::string error;
  Json doc;
  ASSERT_TRUE(JsonParser::Parse(ReadFile(path), &doc, &error)) << error;
  Json* events = doc.Find("traceEvents");
  ASSERT_NE(events, nullptr);
  Trace trace;
  trace.events = std::move(events->items);
  // Whether any record was dropped depends on how fast the writer thread ran; what must hold
  // either way is that every record was written or counted.
  const int64_t dropped = trace.Dropped();
  EXPECT_EQ(static_cast<int64_t>(trace.Count("B", "QUEUE") + trace.Count("E")) + dropped,
            2 * kPairs);
  EXPECT_EQ(trace.Count("M", "thread_name"), 1u);
}

TEST(TimelineJsonParserTest, AcceptsValidJsonAndRejectsTheRest) {
  Json doc;
  std::string error;
  ASSERT_TRUE(JsonParser::Parse(
      R"( {"a":[0,-2.5e3,true,false,null,"x\u00e9\ud83d\ude00\n\/"],"b":{},"c":[]} )", &doc,
      &error))
      << error;
  const Json* a = doc.Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 6u);
  EXPECT_EQ(a->items[1].number, -2500);
  EXPECT_TRUE(a->items[2].boolean);
  EXPECT_EQ(a->items[4].type, Json::Type::kNull);
  EXPECT_EQ(a->items[5].string, "x\xc3\xa9\xf0\x9f\x98\x80\n/");
  EXPECT_EQ(doc.Find("b")->type, Json::Type::kObject);

  for (const char* bad :
       {"", "{", "[1 2]", "{\"a\":1,}", "[1,]", "{\"a\"}", "01", "1.", "-", "\"\x01\"", "\"\\x\"",
        "\"\\ud800\"", "\"\\udc00\"", "\"\xff\"", "\"\xc0\xaf\"", "{} x", "tru", "'a'"}) {
    Json value;
    EXPECT_FALSE(JsonParser::Parse(bad, &value, &error)) << "accepted: " << bad;
  }
}

}  // namespace
}  // namespace gradsync
