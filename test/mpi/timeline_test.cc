// The timeline end to end: started at run time and through GRADSYNC_TIMELINE, rank 0's file is
// valid JSON with each tensor's queueing, negotiation (a mark per rank), copies and collective, and
// cycle markers; a group's collectives fall in one cycle; results are unchanged while it records.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "test/mpi/multi_rank_test.h"
#include "test/trace_reader.h"

namespace gradsync {
namespace testing {
namespace {

class TimelineTest : public MultiRankTest {
 protected:
  fs::path TracePath(const std::string& stem) {
    return fs::temp_directory_path() /
           ("gradsync_" + stem + "_" + std::to_string(getpid()) + ".json");
  }

  // Sums of Value over ranks: the data path is the same with the timeline on.
  void ExpectSums(const std::vector<std::unique_ptr<HostTensor>>& tensors, int offset) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (int64_t i = 0; i < tensors[t]->size(); ++i) {
        ASSERT_EQ(tensors[t]->Get(i),
                  Expected(ReduceOp::kSum, DataType::kFloat32, size_, i + offset + t));
      }
    }
  }

  std::unique_ptr<HostTensor> Filled(int64_t n, int offset) {
    auto t = std::make_unique<HostTensor>(DataType::kFloat32, std::vector<int64_t>{n});
    for (int64_t i = 0; i < n; ++i) t->Set(i, Value(ReduceOp::kSum, rank_, i + offset));
    return t;
  }
};

// The events of `name`'s row in order ("B MPI_ALLREDUCE", "E", "i RANK_READY 2", ...).
std::vector<std::string> RowOf(const Trace& trace, const std::string& name) {
  const int64_t tid = trace.RowOf(name);
  EXPECT_GE(tid, 0) << "no row for " << name;
  return tid < 0 ? std::vector<std::string>{} : trace.Sequence(tid);
}

bool Contains(const std::vector<std::string>& sequence, const std::string& event) {
  return std::find(sequence.begin(), sequence.end(), event) != sequence.end();
}

// Index of the cycle (count of CYCLE_START markers before it) in which `name`'s first event
// `event` happens; -1 if none.
int CycleOf(const Trace& trace, const std::string& name, const std::string& event) {
  const int64_t tid = trace.RowOf(name);
  int cycles = 0;
  for (const Json& e : trace.events) {
    if (StringField(e, "name") == "CYCLE_START") ++cycles;
    if (IntField(e, "tid") == tid && StringField(e, "ph") == "B" &&
        StringField(e, "name") == event) {
      return cycles;
    }
  }
  return -1;
}

TEST_F(TimelineTest, StartedAtRunTimeRecordsEveryPhase) {
  const fs::path path = TracePath("timeline_runtime");
  start_timeline(path.string());
  std::vector<std::unique_ptr<HostTensor>> small, group;
  for (int t = 0; t < 20; ++t) small.push_back(Filled(16, t));
  auto large = Filled(1 << 17, 0);  // 512 KiB: reduced alone
  for (int t = 0; t < 8; ++t) group.push_back(Filled(4, 100 + t));
  std::vector<Handle> handles;
  for (int t = 0; t < 20; ++t) {
    AllreduceOptions options;
    options.name = "tl.small." + std::to_string(t);
    handles.push_back(allreduce(small[t]->view(), options));
  }
  AllreduceOptions large_options;
  large_options.name = "tl.large";
  handles.push_back(allreduce(large->view(), large_options));
  std::vector<TensorView> group_views;
  GroupedAllreduceOptions group_options;
  for (int t = 0; t < 8; ++t) {
    group_views.push_back(group[t]->view());
    group_options.names.push_back("tl.group." + std::to_string(t));
  }
  for (const Handle& h : grouped_allreduce(group_views, group_options)) handles.push_back(h);
  HostTensor bcast(DataType::kFloat32, {3});
  BroadcastOptions bcast_options;
  bcast_options.name = "tl.bcast";
  handles.push_back(broadcast(bcast.view(), 0, bcast_options));
  for (const Handle& h : handles) ASSERT_TRUE(Succeeds(h));
  ExpectSums(small, 0);
  ExpectSums(group, 100);
  stop_timeline();
  EXPECT_NO_THROW(stop_timeline());  // stopping twice is harmless
  if (rank_ != 0) {
    EXPECT_FALSE(fs::exists(path)) << "only rank 0 writes";
    return;
  }

  const Trace trace = LoadTrace(path);
  fs::remove(path);
  ASSERT_TRUE(trace.ok);
  ExpectAllClosed(trace);
  EXPECT_GE(trace.Count("i", "CYCLE_START"), 1u);

  // A group always runs in one cycle, so its members are certain to share the fusion buffer;
  // loose small tensors may be picked up one per cycle on a fast background thread.
  const std::vector<std::string> fused = RowOf(trace, "tl.group.3");
  // These runs share one node: fused buckets go through shared memory unless it is turned off
  // (at 2 to 4 ranks folding straight into the outputs, with no copy out).
  const char* shm_threshold = std::getenv("GRADSYNC_SHM_THRESHOLD");
  const bool shared = size_ >= 2 && (shm_threshold == nullptr || std::string(shm_threshold) != "0");
  const std::vector<std::string> phases =
      shared ? std::vector<std::string>{"B QUEUE", "B NEGOTIATE_ALLREDUCE",
                                        "B MEMCPY_IN_FUSION_BUFFER", "B SHM_ALLREDUCE"}
             : std::vector<std::string>{"B QUEUE", "B NEGOTIATE_ALLREDUCE",
                                        "B MEMCPY_IN_FUSION_BUFFER", "B MPI_ALLREDUCE",
                                        "B MEMCPY_OUT_FUSION_BUFFER"};
  for (const std::string& event : phases) EXPECT_TRUE(Contains(fused, event)) << event;
  for (int r = 0; r < size_; ++r) {
    EXPECT_TRUE(Contains(fused, "i RANK_READY " + std::to_string(r))) << "rank " << r;
  }
  // The phases in order: queued, negotiated, copied in, reduced (and copied out).
  std::vector<std::string> starts;
  for (const std::string& e : fused) {
    if (e[0] == 'B') starts.push_back(e);
  }
  EXPECT_EQ(starts, phases);

  // A lone tensor goes through shared memory as a bucket of one where that applies, and is
  // otherwise reduced in place, with no copy.
  const std::vector<std::string> alone = RowOf(trace, "tl.large");
  EXPECT_TRUE(Contains(alone, shared ? "B SHM_ALLREDUCE" : "B MPI_ALLREDUCE"));
  EXPECT_EQ(Contains(alone, "B MEMCPY_IN_FUSION_BUFFER"), shared);
  EXPECT_TRUE(Contains(RowOf(trace, "tl.bcast"), "B MPI_BCAST"));

  const char* reduce = shared ? "SHM_ALLREDUCE" : "MPI_ALLREDUCE";
  const int group_cycle = CycleOf(trace, "tl.group.0", reduce);
  EXPECT_GE(group_cycle, 1);
  for (int t = 1; t < 8; ++t) {
    EXPECT_EQ(CycleOf(trace, "tl.group." + std::to_string(t), reduce), group_cycle)
        << "member " << t;
  }
}

// A batch's last bucket: negotiated in the first step, reduced on the caller's thread after (past
// two ranks of one node, where it goes through node shared memory, negotiated every step).
// While a rank waits for a late peer its cycles hold the tensor and get nothing done: they do not
// each mark the timeline (about a thousand marks a second, for as long as the wait).
TEST_F(TimelineTest, CyclesWaitingForALatePeerDoNotFloodTheTimeline) {
  if (size_ < 2) GTEST_SKIP() << "needs a late peer";
  const fs::path path = TracePath("timeline_late_peer");
  start_timeline(path.string());
  auto tensor = Filled(16, 0);
  if (rank_ == size_ - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  AllreduceOptions options;
  options.name = "tl.late";
  ASSERT_TRUE(Succeeds(allreduce(tensor->view(), options)));
  stop_timeline();
  if (rank_ != 0) return;
  const Trace trace = LoadTrace(path);
  fs::remove(path);
  ASSERT_TRUE(trace.ok);
  ExpectAllClosed(trace);
  EXPECT_GE(trace.Count("i", "CYCLE_START"), 1u);
  EXPECT_LT(trace.Count("i", "CYCLE_START"), 20u);
}

TEST_F(TimelineTest, ABatchsLastBucketShowsWhereItWasReduced) {
  const fs::path path = TracePath("timeline_batch");
  start_timeline(path.string());
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<TensorView> views;
  AllreduceBatchOptions options;
  for (int t = 0; t < 3; ++t) {
    tensors.push_back(Filled(8, t));
    views.push_back(tensors.back()->view());
    options.names.push_back("tl.batch." + std::to_string(t));
  }
  AllreduceBatch batch(views, options);
  for (int step = 0; step < 3; ++step) {
    for (int t = 0; t < 3; ++t) {
      for (int64_t i = 0; i < 8; ++i) tensors[t]->Set(i, Value(ReduceOp::kSum, rank_, i + t));
      batch.start(t, views[t].data);
    }
    batch.wait();
    ExpectSums(tensors, 0);
  }
  stop_timeline();
  if (rank_ != 0) return;
  const Trace trace = LoadTrace(path);
  fs::remove(path);
  ASSERT_TRUE(trace.ok);
  ExpectAllClosed(trace);
  const std::vector<std::string> row = RowOf(trace, "bucket(tl.batch.0..tl.batch.2)");
  const bool lane = CallerReduces(size_);
  EXPECT_EQ(std::count(row.begin(), row.end(), "B NEGOTIATE_ALLREDUCE"), lane ? 1 : 3);
  EXPECT_EQ(std::count(row.begin(), row.end(), "B CALLER_ALLREDUCE"), lane ? 2 : 0);
}

TEST_F(TimelineTest, EnvironmentVariableStartsOneAtInit) {
  const fs::path path = TracePath("timeline_env");
  shutdown();
  setenv("GRADSYNC_TIMELINE", path.c_str(), 1);
  init();
  unsetenv("GRADSYNC_TIMELINE");
  auto tensor = Filled(8, 7);
  AllreduceOptions options;
  options.name = "tl.env";
  ASSERT_TRUE(Succeeds(allreduce(tensor->view(), options)));
  if (rank_ == 0) {
    EXPECT_THROW(start_timeline(path.string() + ".second"), Error) << "one is already running";
  } else {
    EXPECT_NO_THROW(start_timeline(path.string() + ".second")) << "a no-op off rank 0";
  }
  shutdown();  // finishes the file
  init();      // for the fixture's TearDown
  if (rank_ != 0) return;
  const Trace trace = LoadTrace(path);
  fs::remove(path);
  ASSERT_TRUE(trace.ok);
  ExpectAllClosed(trace);
  const char* shm_threshold = std::getenv("GRADSYNC_SHM_THRESHOLD");
  const bool shared = size_ >= 2 && (shm_threshold == nullptr || std::string(shm_threshold) != "0");
  EXPECT_TRUE(Contains(RowOf(trace, "tl.env"), shared ? "B SHM_ALLREDUCE" : "B MPI_ALLREDUCE"));
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
