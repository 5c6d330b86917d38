// The negotiation protocol played by N threads over the in-process channel: ordering, validation,
// the response cache, stall warning and shutdown, and shutdown requests.
#include "coordinator/negotiator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "test/unit/in_process_channel.h"

namespace gradsync {
namespace {

Request MakeRequest(const std::string& name, std::vector<int64_t> shape = {4},
                    DataType dtype = DataType::kFloat32) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = dtype;
  r.shape = std::move(shape);
  return r;
}

// The negotiator reads a tensor's parameters from its entry, as the background loop hands it.
std::unique_ptr<TensorEntry> EntryFor(const Request& request) {
  auto entry = std::make_unique<TensorEntry>();
  entry->name = request.name;
  entry->name_hash = HashName(request.name);  // as TensorQueue::Push sets it
  entry->op = request.op;
  entry->input = TensorView(nullptr, request.dtype, request.shape, request.device);
  entry->reduce_op = request.reduce_op;
  entry->prescale = request.prescale;
  entry->postscale = request.postscale;
  entry->root = request.root;
  entry->group = request.group;
  entry->group_size = request.group_size;
  return entry;
}

struct RankLog {
  std::vector<Response> responses;
  // Each cycle's outcome; its response pointers are not valid after the run, so the responses
  // are copied into cycle_responses.
  std::vector<CycleOutcome> cycles;
  std::vector<std::vector<Response>> cycle_responses;
};

using SubmitFn = std::function<std::vector<Request>(int rank, int cycle)>;

// Runs `cycles` negotiation cycles on every rank, one thread per rank. Each rank's clock advances
// `seconds_per_cycle` per cycle, so stall timing is deterministic.
std::vector<RankLog> RunRanks(int size, int cycles, const Config& config, const SubmitFn& submit,
                              InProcessHub* hub = nullptr, double seconds_per_cycle = 0.01,
                              std::function<bool(int rank, int cycle)> want_shutdown = nullptr) {
  InProcessHub own_hub(size);
  if (hub == nullptr) hub = &own_hub;
  std::vector<RankLog> logs(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      auto channel = hub->Channel(rank);
      int cycle = 0;
      Negotiator negotiator(channel.get(), config, [&] { return cycle * seconds_per_cycle; });
      std::vector<std::unique_ptr<TensorEntry>> entries;  // alive until the run ends
      for (; cycle < cycles; ++cycle) {
        std::vector<TensorEntry*> fresh;
        for (const Request& request : submit(rank, cycle)) {
          entries.push_back(EntryFor(request));
          fresh.push_back(entries.back().get());
        }
        CycleOutcome outcome;
        const bool shutdown = want_shutdown && want_shutdown(rank, cycle);
        const Status s = negotiator.RunCycle(fresh, shutdown, &outcome);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ASSERT_EQ(outcome.entries.size(), outcome.responses.size());
        for (size_t i = 0; i < outcome.responses.size(); ++i) {
          const Response& r = *outcome.responses[i];
          // Each response comes back with the entry this rank submitted under that name.
          if (r.type == ResponseType::kStallShutdown) continue;
          ASSERT_NE(outcome.entries[i], nullptr) << r.name;
          EXPECT_EQ(outcome.entries[i]->name, r.name);
        }
        // A full round that brings responses puts them in the cache, which may evict cached ones,
        // so in such a cycle the outcome must own every response it points to.
        if (outcome.full_round && !outcome.owned.empty()) {
          for (const Response* r : outcome.responses) {
            const bool owned = std::any_of(outcome.owned.begin(), outcome.owned.end(),
                                           [r](const ResponsePtr& p) { return p.get() == r; });
            EXPECT_TRUE(owned) << "cycle " << cycle << ": response '" << r->name << "'";
          }
        }
        logs[rank].cycle_responses.emplace_back();
        for (const Response* r : outcome.responses) {
          logs[rank].responses.push_back(*r);
          logs[rank].cycle_responses.back().push_back(*r);
        }
        outcome.responses.clear();
        logs[rank].cycles.push_back(std::move(outcome));
      }
    });
  }
  for (auto& t : threads) t.join();
  return logs;
}

std::vector<std::string> Names(const std::vector<Response>& responses) {
  std::vector<std::string> names;
  for (const Response& r : responses) names.push_back(r.name);
  return names;
}

void ExpectSameOnEveryRank(const std::vector<RankLog>& logs) {
  for (size_t r = 1; r < logs.size(); ++r) {
    ASSERT_EQ(logs[r].responses.size(), logs[0].responses.size()) << "rank " << r;
    for (size_t i = 0; i < logs[0].responses.size(); ++i) {
      EXPECT_EQ(logs[r].responses[i], logs[0].responses[i]) << "rank " << r << " response " << i;
    }
  }
}

TEST(NegotiatorTest, SingleRankRunsEverythingAtOnce) {
  auto logs = RunRanks(1, 1, Config(), [](int, int) {
    return std::vector<Request>{MakeRequest("a"), MakeRequest("b")};
  });
  EXPECT_EQ(Names(logs[0].responses), (std::vector<std::string>{"a", "b"}));
}

TEST(NegotiatorTest, RanksSubmittingInDifferentOrdersAgreeOnOneOrder) {
  static constexpr int kSize = 4, kTensors = 40;
  auto logs = RunRanks(kSize, 12, Config(), [](int rank, int cycle) {
    // Each rank submits all tensors, shuffled differently, spread over the first 8 cycles.
    std::vector<int> order(kTensors);
    for (int i = 0; i < kTensors; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(rank + 1));
    std::vector<Request> fresh;
    for (int i = cycle * 5; i < std::min(kTensors, cycle * 5 + 5); ++i) {
      fresh.push_back(MakeRequest("t" + std::to_string(order[i])));
    }
    return fresh;
  });
  ExpectSameOnEveryRank(logs);
  const auto names = Names(logs[0].responses);
  EXPECT_EQ(names.size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(),
            static_cast<size_t>(kTensors));
}

TEST(NegotiatorTest, MismatchedDtypeFailsOnEveryRankAndLaterTensorsWork) {
  auto logs = RunRanks(3, 2, Config(), [](int rank, int cycle) {
    if (cycle == 0) {
      return std::vector<Request>{
          MakeRequest("w", {4}, rank == 1 ? DataType::kInt32 : DataType::kFloat32)};
    }
    return std::vector<Request>{MakeRequest("next")};
  });
  ExpectSameOnEveryRank(logs);
  ASSERT_EQ(logs[0].responses.size(), 2u);
  const Response& error = logs[0].responses[0];
  EXPECT_EQ(error.type, ResponseType::kError);
  EXPECT_NE(error.error.find("dtype"), std::string::npos) << error.error;
  EXPECT_NE(error.error.find("rank 1 has int32"), std::string::npos) << error.error;
  EXPECT_NE(error.error.find("ranks 0, 2 have float32"), std::string::npos) << error.error;
  EXPECT_EQ(logs[0].responses[1].type, ResponseType::kAllreduce);
}

TEST(NegotiatorTest, EachValidatedFieldIsReported) {
  struct Case {
    const char* field;
    std::function<void(Request*)> change;
  };
  const std::vector<Case> cases = {
      {"shape", [](Request* r) { r->shape = {5}; }},
      {"operation", [](Request* r) { r->op = OpType::kBroadcast; }},
      {"reduce op", [](Request* r) { r->reduce_op = ReduceOp::kMax; }},
      {"prescale", [](Request* r) { r->prescale = 2.0; }},
      {"postscale", [](Request* r) { r->postscale = 0.5; }},
      {"device", [](Request* r) { r->device = Device::Cuda(0); }},
  };
  for (const Case& c : cases) {
    auto logs = RunRanks(2, 1, Config(), [&](int rank, int) {
      Request r = MakeRequest("x");
      if (rank == 1) c.change(&r);
      return std::vector<Request>{r};
    });
    ASSERT_EQ(logs[1].responses.size(), 1u) << c.field;
    EXPECT_EQ(logs[1].responses[0].type, ResponseType::kError) << c.field;
    EXPECT_NE(logs[1].responses[0].error.find(c.field), std::string::npos)
        << c.field << ": " << logs[1].responses[0].error;
  }
}

TEST(NegotiatorTest, BroadcastRootsMustAgree) {
  auto logs = RunRanks(2, 1, Config(), [](int rank, int) {
    Request r = MakeRequest("b");
    r.op = OpType::kBroadcast;
    r.root = rank;
    return std::vector<Request>{r};
  });
  ASSERT_EQ(logs[0].responses.size(), 1u);
  EXPECT_NE(logs[0].responses[0].error.find("root rank"), std::string::npos);
}

TEST(NegotiatorTest, AllgatherCollectsFirstDimensionsAndChecksTheRest) {
  auto logs = RunRanks(3, 2, Config(), [](int rank, int cycle) {
    Request r = MakeRequest(cycle == 0 ? "ok" : "bad", {rank + 1, 3});
    r.op = OpType::kAllgather;
    if (cycle == 1 && rank == 2) r.shape = {1, 4};
    return std::vector<Request>{r};
  });
  ExpectSameOnEveryRank(logs);
  ASSERT_EQ(logs[0].responses.size(), 2u);
  EXPECT_EQ(logs[0].responses[0].first_dims, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(logs[0].responses[1].type, ResponseType::kError);
}

std::vector<Request> Group(const std::string& group, int members) {
  std::vector<Request> requests;
  for (int i = 0; i < members; ++i) {
    requests.push_back(MakeRequest(group + ".m" + std::to_string(i)));
    requests.back().group = group;
    requests.back().group_size = members;
  }
  return requests;
}

// For each cycle, how many responses belong to `group` (by name prefix).
std::vector<int> GroupMembersPerCycle(const RankLog& log, const std::string& group) {
  std::vector<int> counts;
  for (const std::vector<Response>& responses : log.cycle_responses) {
    int n = 0;
    for (const Response& r : responses) n += r.name.rfind(group + ".m", 0) == 0 ? 1 : 0;
    counts.push_back(n);
  }
  return counts;
}

TEST(NegotiatorTest, GroupRunsInOneCycleThroughTheFullRoundAndTheCache) {
  // Rank r submits group G at cycle r, and again at cycle 9 - r; a lone tensor every cycle keeps
  // other work flowing around it. The second time, every member is cached.
  constexpr int kMembers = 5;
  auto logs = RunRanks(4, 12, Config(), [](int rank, int cycle) {
    std::vector<Request> fresh = {MakeRequest("solo." + std::to_string(cycle))};
    if (cycle == rank || cycle == 9 - rank) {
      for (Request& r : Group("G", kMembers)) fresh.push_back(r);
    }
    return fresh;
  });
  ExpectSameOnEveryRank(logs);
  for (const RankLog& log : logs) {
    std::vector<int> expected(12, 0);
    expected[3] = kMembers;  // the last rank submits at cycle 3
    expected[9] = kMembers;  // rank 0 submits the second time at cycle 9
    EXPECT_EQ(GroupMembersPerCycle(log, "G"), expected);
    EXPECT_GE(log.cycles[9].cache_hits, kMembers);
  }
}

TEST(NegotiatorTest, GroupLargerThanTheCacheStillRunsInOneCycle) {
  Config config;
  config.cache_capacity = 3;  // some members always evict others
  constexpr int kMembers = 6;
  auto logs = RunRanks(3, 8, config, [](int rank, int cycle) {
    std::vector<Request> fresh;
    if (cycle == rank || cycle == 4 + (rank + 1) % 3) fresh = Group("big", kMembers);
    return fresh;
  });
  ExpectSameOnEveryRank(logs);
  for (const RankLog& log : logs) {
    const std::vector<int> counts = GroupMembersPerCycle(log, "big");
    EXPECT_EQ(counts[2], kMembers);
    EXPECT_EQ(counts[6], kMembers);
    int total = 0;
    for (int n : counts) total += n;
    EXPECT_EQ(total, 2 * kMembers);
  }
}

TEST(NegotiatorTest, RanksDisagreeingAboutAGroupGetErrorsTogetherNotAHang) {
  // Rank 1 submits the members as lone tensors, one per cycle; rank 0's view (a group of 3) holds
  // them until the last arrives, and then all fail together.
  auto logs = RunRanks(3, 4, Config(), [](int rank, int cycle) {
    if (cycle == 3) return std::vector<Request>{MakeRequest("after")};
    if (rank != 1) return cycle == 0 ? Group("G", 3) : std::vector<Request>{};
    Request lone = MakeRequest("G.m" + std::to_string(cycle));
    return std::vector<Request>{lone};
  });
  ExpectSameOnEveryRank(logs);
  for (const RankLog& log : logs) {
    EXPECT_EQ(GroupMembersPerCycle(log, "G"), (std::vector<int>{0, 0, 3, 0}));
  }
  ASSERT_EQ(logs[0].responses.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(logs[0].responses[i].type, ResponseType::kError) << i;
    EXPECT_NE(logs[0].responses[i].error.find("group"), std::string::npos);
  }
  EXPECT_EQ(logs[0].responses[3].type, ResponseType::kAllreduce);
}

TEST(NegotiatorTest, SecondStepIsServedFromTheCache) {
  static constexpr int kTensors = 100;
  auto logs = RunRanks(4, 2, Config(), [](int, int) {
    std::vector<Request> fresh;
    for (int i = 0; i < kTensors; ++i) fresh.push_back(MakeRequest("g" + std::to_string(i)));
    return fresh;
  });
  ExpectSameOnEveryRank(logs);
  for (const RankLog& log : logs) {
    EXPECT_TRUE(log.cycles[0].full_round);
    EXPECT_EQ(log.cycle_responses[0].size(), static_cast<size_t>(kTensors));
    EXPECT_FALSE(log.cycles[1].full_round);
    EXPECT_EQ(log.cycles[1].cache_hits, kTensors);
  }
}

TEST(NegotiatorTest, ChangedParametersInvalidateTheCacheEverywhere) {
  auto logs = RunRanks(3, 3, Config(), [](int rank, int cycle) {
    // Cycle 1: rank 2 changes the shape of a cached tensor: an error on every rank. Cycle 2: all
    // ranks use the new shape: negotiated afresh and executed.
    std::vector<int64_t> shape = {4};
    if (cycle == 2 || (cycle == 1 && rank == 2)) shape = {8};
    return std::vector<Request>{MakeRequest("p", shape)};
  });
  ExpectSameOnEveryRank(logs);
  ASSERT_EQ(logs[0].responses.size(), 3u);
  EXPECT_EQ(logs[0].responses[1].type, ResponseType::kError);
  EXPECT_NE(logs[0].responses[1].error.find("shape"), std::string::npos);
  EXPECT_EQ(logs[0].responses[2].type, ResponseType::kAllreduce);
  EXPECT_EQ(logs[0].responses[2].shape, (std::vector<int64_t>{8}));
}

TEST(NegotiatorTest, CacheEvictionKeepsRanksConsistent) {
  Config config;
  config.cache_capacity = 3;
  auto logs = RunRanks(4, 10, config, [](int rank, int cycle) {
    std::vector<Request> fresh;
    for (int i = 0; i < 5; ++i) {
      // Ranks see tensors in rotated orders so some are cached-pending on one rank while another
      // rank's new tensors evict them.
      fresh.push_back(MakeRequest("e" + std::to_string((i + rank + cycle) % 5) + "_" +
                                  std::to_string(cycle % 2)));
    }
    return fresh;
  });
  ExpectSameOnEveryRank(logs);
  EXPECT_EQ(logs[0].responses.size(), 50u);
}

TEST(NegotiatorTest, DisabledCacheAlwaysNegotiatesInFull) {
  Config config;
  config.cache_capacity = 0;
  auto logs =
      RunRanks(2, 3, config, [](int, int) { return std::vector<Request>{MakeRequest("a")}; });
  for (const CycleOutcome& c : logs[0].cycles) {
    EXPECT_TRUE(c.full_round);
    EXPECT_EQ(c.cache_hits, 0);
  }
}

// With room for one response, the full round that caches "b" evicts "a", which the same cycle
// served from the cache: the outcome must keep "a" alive.
TEST(NegotiatorTest, ResponseEvictedByTheSameCyclesFullRoundStaysValid) {
  Config config;
  config.cache_capacity = 1;
  auto logs = RunRanks(2, 2, config, [](int, int cycle) {
    if (cycle == 0) return std::vector<Request>{MakeRequest("a")};
    return std::vector<Request>{MakeRequest("a"), MakeRequest("b")};
  });
  for (const RankLog& log : logs) {
    EXPECT_EQ(log.cycles[1].cache_hits, 1);
    EXPECT_TRUE(log.cycles[1].full_round);
    EXPECT_EQ(Names(log.cycle_responses[1]), (std::vector<std::string>{"a", "b"}));
  }
}

// With room for one response, cycle 1's full round gives "a"'s bit to "b" while rank 0 still holds
// its "a" there; "b" submitted again in the next cycle finds that bit: the stale "a" must leave it
// first (it was taken for "b" negotiated twice, and the process aborted).
TEST(NegotiatorTest, ABitEvictedWhileHeldServesItsNewNameInTheNextCycle) {
  Config config;
  config.cache_capacity = 1;
  auto logs = RunRanks(2, 4, config, [](int rank, int cycle) {
    switch (cycle) {
      case 0:
        return std::vector<Request>{MakeRequest("a")};
      case 1:
        return rank == 0 ? std::vector<Request>{MakeRequest("a"), MakeRequest("b")}
                         : std::vector<Request>{MakeRequest("b")};
      case 2:
        return std::vector<Request>{MakeRequest("b")};
      default:
        return rank == 1 ? std::vector<Request>{MakeRequest("a")} : std::vector<Request>{};
    }
  });
  ExpectSameOnEveryRank(logs);
  EXPECT_EQ(Names(logs[0].responses), (std::vector<std::string>{"a", "b", "b", "a"}));
}

TEST(NegotiatorTest, MissingRankProducesStallShutdownNamingIt) {
  Config config;
  config.stall_warning_seconds = 0.05;
  config.stall_shutdown_seconds = 0.2;
  auto logs = RunRanks(3, 40, config, [](int rank, int cycle) {
    if (cycle == 0 && rank != 1) return std::vector<Request>{MakeRequest("lost")};
    return std::vector<Request>{};
  });
  ExpectSameOnEveryRank(logs);
  ASSERT_FALSE(logs[0].responses.empty());
  const Response& last = logs[0].responses.back();
  EXPECT_EQ(last.type, ResponseType::kStallShutdown);
  EXPECT_NE(last.error.find("'lost'"), std::string::npos) << last.error;
  EXPECT_NE(last.error.find("missing on rank 1"), std::string::npos) << last.error;
}

TEST(NegotiatorTest, StallOfACachedTensorIsDetectedToo) {
  Config config;
  config.stall_warning_seconds = 0.05;
  config.stall_shutdown_seconds = 0.3;
  auto logs = RunRanks(2, 80, config, [](int rank, int cycle) {
    // Step 1 caches "w"; in step 2 rank 1 never submits it.
    if (cycle == 0 || (cycle == 5 && rank == 0)) return std::vector<Request>{MakeRequest("w")};
    return std::vector<Request>{};
  });
  ExpectSameOnEveryRank(logs);
  ASSERT_EQ(logs[0].responses.size(), 2u);
  EXPECT_EQ(logs[0].responses[1].type, ResponseType::kStallShutdown);
  EXPECT_NE(logs[0].responses[1].error.find("missing on rank 1"), std::string::npos)
      << logs[0].responses[1].error;
}

TEST(NegotiatorTest, NoStallShutdownWhenDisabled) {
  Config config;
  config.stall_warning_seconds = 0.05;
  config.stall_shutdown_seconds = 0;
  auto logs = RunRanks(2, 60, config, [](int rank, int cycle) {
    if (cycle == 0 && rank == 0) return std::vector<Request>{MakeRequest("lost")};
    return std::vector<Request>{};
  });
  EXPECT_TRUE(logs[0].responses.empty());
}

TEST(NegotiatorTest, ShutdownRequestReachesEveryRank) {
  auto logs = RunRanks(
      3, 3, Config(), [](int, int) { return std::vector<Request>{}; }, nullptr, 0.01,
      [](int rank, int cycle) { return rank == 2 && cycle == 1; });
  for (const RankLog& log : logs) {
    EXPECT_FALSE(log.cycles[0].shutdown);
    EXPECT_TRUE(log.cycles[1].shutdown);
  }
}

TEST(NegotiatorTest, ASlowRankDoesNotChangeTheOutcome) {
  InProcessHub hub(3);
  hub.HoldBack(2, std::chrono::microseconds(300));
  auto logs = RunRanks(
      3, 6, Config(),
      [](int rank, int cycle) {
        std::vector<Request> fresh;
        if (cycle == rank) {
          for (int i = 0; i < 10; ++i) fresh.push_back(MakeRequest("s" + std::to_string(i)));
        }
        return fresh;
      },
      &hub);
  ExpectSameOnEveryRank(logs);
  EXPECT_EQ(logs[0].responses.size(), 10u);
  // Nothing can be ready before the last rank (2) submits in cycle 2.
  for (int c = 0; c < 2; ++c) EXPECT_TRUE(logs[0].cycle_responses[c].empty());
}

}  // namespace
}  // namespace gradsync
