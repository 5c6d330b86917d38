// Reading a timeline file back in tests: a strict JSON parser and the trace checks every timeline
// must pass. Shared by the timeline's unit test and the multi-rank timeline test.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace gradsync {
namespace testing {

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

inline std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

inline std::string StringField(const Json& object, std::string_view key) {
  const Json* field = object.Find(key);
  return field != nullptr && field->type == Json::Type::kString ? field->string : std::string();
}

// -1 when absent or not a number.
inline int64_t IntField(const Json& object, std::string_view key) {
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
inline Trace LoadTrace(const fs::path& path) {
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
    // A span ("X") is written once it has ended, so it may begin before events already written.
    if (ph != "X") {
      if (ts < last_ts) {
        ADD_FAILURE() << "event " << i << " goes back in time: " << ts << " < " << last_ts;
        return trace;
      }
      last_ts = ts;
    }
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
    if (ph == "X" && IntField(event, "dur") < 0) {
      ADD_FAILURE() << "event " << i << ": a span of negative duration";
      return trace;
    }
    if (ph != "B" && ph != "E" && ph != "i" && ph != "X") {
      ADD_FAILURE() << "event " << i << ": unexpected phase '" << ph << "'";
      return trace;
    }
  }
  trace.ok = true;
  return trace;
}

// Every B on every row was closed.
inline void ExpectAllClosed(const Trace& trace) {
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

}  // namespace testing
}  // namespace gradsync
