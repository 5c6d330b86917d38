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

#include "test/trace_reader.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;
using testing::IntField;
using testing::Json;
using testing::JsonParser;
using testing::LoadTrace;
using testing::ReadFile;
using testing::StringField;
using testing::Trace;

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

// A span known only once it has ended (a device phase) is written as one "X" event with its own
// begin and duration, placed on the tensor's row; one from before Start begins with the file.
TEST_F(TimelineTest, SpansRecordedAfterTheFactKeepTheirOwnTimes) {
  const fs::path path = TempPath("spans");
  Timeline timeline;
  const auto before_start = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  const auto begin = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
  timeline.ActivityStart("w", "DEVICE_LAUNCH");
  timeline.ActivityEnd("w");
  timeline.ActivitySpan("w", "DEVICE_ALLREDUCE", begin, begin + std::chrono::microseconds(1500));
  timeline.ActivitySpan("w", "DEVICE_QUEUE", before_start, begin);
  ASSERT_TRUE(timeline.Stop().ok());

  const Trace trace = LoadTrace(path);
  fs::remove(path);
  ASSERT_TRUE(trace.ok);
  const int64_t row = trace.RowOf("w");
  EXPECT_EQ(
      trace.Sequence(row),
      (std::vector<std::string>{"B DEVICE_LAUNCH", "E", "X DEVICE_ALLREDUCE", "X DEVICE_QUEUE"}));
  int64_t allreduce_ts = -1;
  for (const auto& e : trace.events) {
    if (testing::StringField(e, "ph") != "X") continue;
    if (testing::StringField(e, "name") == "DEVICE_ALLREDUCE") {
      allreduce_ts = testing::IntField(e, "ts");
      EXPECT_EQ(testing::IntField(e, "dur"), 1500);
    } else {
      EXPECT_EQ(testing::IntField(e, "ts"), 0);  // clamped to the start
      EXPECT_GE(testing::IntField(e, "dur"), allreduce_ts - 1);
    }
  }
  EXPECT_GE(allreduce_ts, 5000);
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

// A timeline started in the middle of a step: an end whose begin came before Start is left out,
// and a phase still open at Stop ends there, so each row's begins and ends pair in the file.
TEST_F(TimelineTest, EndsBeforeStartAreLeftOutAndOpenPhasesEndAtStop) {
  const fs::path path = TempPath("window");
  Timeline timeline;
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  timeline.ActivityEnd("begun.before");
  timeline.ActivityStart("still.open", "QUEUE");
  timeline.NegotiateStart("still.open", "ALLREDUCE");
  ASSERT_TRUE(timeline.Stop().ok());
  const Trace trace = LoadTrace(path);
  ASSERT_TRUE(trace.ok);
  EXPECT_EQ(trace.Count("B"), 2u);
  EXPECT_EQ(trace.Count("E"), 2u);
  EXPECT_EQ(trace.Count("M", "thread_name"), 1u);  // no row for the lone end
}

// start_timeline and stop_timeline may be called from any thread: Start and Stop take turns, so
// two starts at once make one file and refuse the other instead of ending the process.
TEST_F(TimelineTest, StartsAndStopsFromSeveralThreadsTakeTurns) {
  for (int round = 0; round < 50; ++round) {
    Timeline timeline;
    const fs::path first = TempPath("first"), second = TempPath("second");
    std::atomic<bool> go{false};
    Status started[2];
    auto start = [&](int i, const fs::path& path) {
      while (!go.load()) std::this_thread::yield();
      started[i] = timeline.Start(path.string());
      timeline.ActivityStart("t", "QUEUE");
      timeline.ActivityEnd("t");
    };
    std::thread a(start, 0, first), b(start, 1, second);
    go = true;
    a.join();
    b.join();
    EXPECT_NE(started[0].ok(), started[1].ok()) << "round " << round;
    std::thread stop_a([&] { timeline.Stop(); }), stop_b([&] { timeline.Stop(); });
    stop_a.join();
    stop_b.join();
    const Trace trace = LoadTrace(started[0].ok() ? first : second);
    ASSERT_TRUE(trace.ok) << "round " << round;
  }
}

// Beyond the bound records are dropped and counted, a begin with its end: every row's begins
// and ends stay balanced (LoadTrace checks their nesting) and pair as they ran, whichever of a
// nested pair was dropped, on rows made before and after drops.
TEST_F(TimelineTest, DropsRecordsBeyondTheBoundAndCountsThem) {
  constexpr int kRounds = 5000;
  const fs::path path = TempPath("bounded");
  // Room for 10: the first rows' records fill it in the middle of a row's begins and ends.
  Timeline timeline(/*max_pending_events=*/10);
  ASSERT_TRUE(timeline.Start(path.string()).ok());
  for (int i = 0; i < kRounds; ++i) {
    const std::string name = "t" + std::to_string(i % 3);
    timeline.ActivityStart(name, "QUEUE");
    timeline.NegotiateStart(name, "ALLREDUCE");
    timeline.NegotiateEnd(name);
    timeline.ActivityStart(name, "MPI_ALLREDUCE");
    timeline.ActivityEnd(name);
    timeline.ActivityEnd(name);
  }
  ASSERT_TRUE(timeline.Stop().ok());

  const Trace trace = LoadTrace(path);
  ASSERT_TRUE(trace.ok);
  // Whether any record was dropped depends on how fast the writer thread ran; what must hold
  // either way is that every record was written or counted, and that ends match begins.
  const int64_t dropped = trace.Dropped();
  const size_t begins = trace.Count("B", "QUEUE") + trace.Count("B", "NEGOTIATE_ALLREDUCE") +
                        trace.Count("B", "MPI_ALLREDUCE");
  EXPECT_EQ(trace.Count("E"), begins);
  EXPECT_EQ(static_cast<int64_t>(2 * begins) + dropped, 6 * kRounds);
  // An inner phase closes before the next begins: its own end, not its outer phase's, follows it.
  for (const auto& [tid, row] : trace.rows) {
    const std::vector<std::string> sequence = trace.Sequence(tid);
    for (size_t k = 0; k < sequence.size(); ++k) {
      if (sequence[k] != "B NEGOTIATE_ALLREDUCE" && sequence[k] != "B MPI_ALLREDUCE") continue;
      ASSERT_LT(k + 1, sequence.size()) << row;
      EXPECT_EQ(sequence[k + 1], "E") << row << " at " << k;
    }
  }
  // A row is named only once one of its records is kept.
  EXPECT_GE(trace.Count("M", "thread_name"), 1u);
  EXPECT_LE(trace.Count("M", "thread_name"), 3u);
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
