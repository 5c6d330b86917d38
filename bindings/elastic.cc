// gradsync::elastic (gradsync/elastic.h): resume, commit and leaving a world, over
// elastic_store.h's commits and gradsyncrun's endpoint (launch/elastic_driver.py).
#include "gradsync/elastic.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "bindings/elastic_store.h"
#include "bindings/runtime.h"
#include "gradsync/gradsync.h"
#include "runtime/logging.h"

namespace gradsync {
namespace elastic {

namespace {

// How long a rank waits on its own part (its commits written, the newest read) between the rounds
// of UntilEveryRank.
constexpr double kRoundSeconds = 1.0;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

// The version in the launcher's answer to GET /hosts ({"version": N}), or -1 when it cannot be had.
int64_t AskHostsVersion(const std::string& driver) {
  const size_t colon = driver.rfind(':');
  if (colon == std::string::npos) return -1;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(driver.substr(0, colon).c_str(), driver.substr(colon + 1).c_str(), &hints,
                  &found) != 0) {
    return -1;
  }
  int64_t version = -1;
  const int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  if (fd >= 0) {
    timeval timeout{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    const std::string request = "GET /hosts HTTP/1.0\r\nHost: " + driver + "\r\n\r\n";
    std::string reply;
    if (connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
        send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(request.size())) {
      char chunk[512];
      ssize_t n = 0;
      while ((n = recv(fd, chunk, sizeof(chunk), 0)) > 0) reply.append(chunk, n);
    }
    close(fd);
    const size_t key = reply.find("\"version\"");
    const size_t value = key == std::string::npos ? key : reply.find(':', key);
    if (value != std::string::npos) version = std::strtoll(reply.c_str() + value + 1, nullptr, 10);
  }
  freeaddrinfo(found);
  return version;
}

// Rank 0's view of the launcher's hosts, refreshed once a second by a thread of its own, so that
// a commit never waits on the network. Never destroyed: the thread runs until the process ends.
class HostWatch {
 public:
  HostWatch(std::string driver, int64_t started_with) : started_with_(started_with) {
    seen_.store(started_with);
    std::thread([this, driver = std::move(driver)] {
      for (;;) {
        const int64_t version = AskHostsVersion(driver);
        if (version >= 0) seen_.store(version);
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }).detach();
  }
  bool changed() const { return seen_.load() != started_with_; }

 private:
  const int64_t started_with_;
  std::atomic<int64_t> seen_{0};
};

struct ElasticState {
  std::mutex mu;
  int64_t commits = 0;  // the last commit's number, the same on every rank
  std::unique_ptr<CommitWriter> writer;
  std::string writer_directory;
  HostWatch* watch = nullptr;
};

ElasticState& TheState() {
  static auto* state = new ElasticState;
  return *state;
}

bool HostsChanged() {
  const std::string driver = Env("GRADSYNC_ELASTIC_DRIVER");
  if (driver.empty()) return false;
  ElasticState& state = TheState();
  if (state.watch == nullptr) {
    state.watch = new HostWatch(
        driver, std::strtoll(Env("GRADSYNC_ELASTIC_HOSTS_VERSION").c_str(), nullptr, 10));
  }
  return state.watch->changed();
}

int64_t ReduceInt64(int64_t value, ReduceOp op, const char* name) {
  AllreduceOptions options;
  options.name = name;
  options.op = op;
  allreduce(TensorView(&value, DataType::kInt64, {}), options).wait();
  return value;
}

void BroadcastBytes(void* data, int64_t bytes, int root, const char* name) {
  BroadcastOptions options;
  options.name = name;
  broadcast(TensorView(data, DataType::kUInt8, {bytes}), root, options).wait();
}

// Returns once `done_within(seconds)` (this rank's wait for its own part, true once it is done)
// has said true on every rank. The ranks agree in rounds, an allreduce each kRoundSeconds, so that
// a rank with nothing to wait for waits in collectives that each complete, never in one the stall
// inspector ends while another rank writes or reads a large commit.
void UntilEveryRank(const std::function<bool(double)>& done_within, const char* name) {
  for (;;) {
    if (ReduceInt64(done_within(kRoundSeconds) ? 1 : 0, ReduceOp::kMin, name) == 1) return;
  }
}

}  // namespace

bool under_launcher() { return !Env("GRADSYNC_ELASTIC_DRIVER").empty(); }

Resumed resume() {
  const std::string directory = Env("GRADSYNC_ELASTIC_CHECKPOINT_DIR");
  const int64_t newest = directory.empty() ? -1 : LatestCommit(directory);
  Resumed resumed;
  resumed.commit = ReduceInt64(newest, ReduceOp::kMax, "elastic.newest_commit");
  if (resumed.commit < 0) return resumed;
  const int64_t candidate = newest == resumed.commit ? rank() : size();
  resumed.source_rank =
      static_cast<int>(ReduceInt64(candidate, ReduceOp::kMin, "elastic.commit_source"));
  // The source sends the length first, or -1 when it could not read the file, so that no rank is
  // left waiting for bytes that will not come.
  int64_t length = -1;
  Status read;
  std::future<Status> reading;
  if (rank() == resumed.source_rank) {
    reading = std::async(std::launch::async, ReadCommit, directory, resumed.commit, &resumed.state);
  }
  UntilEveryRank(
      [&](double seconds) {
        return !reading.valid() || reading.wait_for(std::chrono::duration<double>(seconds)) ==
                                       std::future_status::ready;
      },
      "elastic.commit_read");
  if (reading.valid()) {
    read = reading.get();
    if (read.ok()) length = static_cast<int64_t>(resumed.state.size());
  }
  BroadcastBytes(&length, sizeof(length), resumed.source_rank, "elastic.commit_length");
  if (length < 0) {
    if (!read.ok()) Throw(read);
    Throw(Status::Internal("elastic resume: rank " + std::to_string(resumed.source_rank) +
                           " could not read commit " + std::to_string(resumed.commit) + " in " +
                           directory));
  }
  resumed.state.resize(static_cast<size_t>(length));
  if (length > 0) {
    BroadcastBytes(&resumed.state[0], length, resumed.source_rank, "elastic.commit_state");
  }
  std::lock_guard<std::mutex> lock(TheState().mu);
  TheState().commits = resumed.commit;
  return resumed;
}

bool commit(std::string state) {
  ElasticState& elastic = TheState();
  {
    std::lock_guard<std::mutex> lock(elastic.mu);
    const int64_t number = ++elastic.commits;
    const std::string directory = Env("GRADSYNC_ELASTIC_CHECKPOINT_DIR");
    if (!directory.empty() && local_rank() == 0) {
      if (elastic.writer == nullptr || elastic.writer_directory != directory) {
        elastic.writer.reset();  // finishes a write under way into the directory before
        elastic.writer = std::make_unique<CommitWriter>(directory);
        elastic.writer_directory = directory;
      }
      const Status submitted = elastic.writer->Submit(number, std::move(state));
      if (!submitted.ok()) Throw(submitted);
    }
  }
  int64_t changed = rank() == 0 && HostsChanged() ? 1 : 0;
  BroadcastBytes(&changed, sizeof(changed), 0, "elastic.hosts_changed");
  return changed != 0;
}

void leave_for_restart() {
  ElasticState& elastic = TheState();
  // Every rank's commits are on disk before any rank leaves.
  UntilEveryRank(
      [&](double seconds) {
        std::lock_guard<std::mutex> lock(elastic.mu);
        bool flushed = true;
        // Leaving with kExitRestart tells the launcher the commits are on disk: a failed write
        // throws instead, so that the job fails as it does when the Python state's flush raises,
        // rather than the next world resuming from an older commit than it was told.
        if (elastic.writer != nullptr) {
          const Status written = elastic.writer->FlushFor(seconds, &flushed);
          if (!written.ok()) Throw(written);
        }
        return flushed;
      },
      "elastic.flushed");
  shutdown();
  std::exit(kExitRestart);
}

}  // namespace elastic
}  // namespace gradsync
