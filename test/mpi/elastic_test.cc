// gradsync::elastic (gradsync/elastic.h): the commit files, resume from the newest commit any rank
// holds (a shared directory, and node-local ones where another rank has the newest), commits
// written by the writer thread, and the launcher's announcement of other hosts reaching every rank
// at the same commit. The launcher itself is tested in test/launch and test/elastic.
#include <gradsync/elastic.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "bindings/elastic_store.h"
#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

class ElasticTest : public MultiRankTest {
 protected:
  void TearDown() override {
    unsetenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR");
    unsetenv("GRADSYNC_ELASTIC_DRIVER");
    unsetenv("GRADSYNC_ELASTIC_HOSTS_VERSION");
    MultiRankTest::TearDown();
  }
  // A new empty directory, made by rank 0 and the same on every rank, or this rank's own.
  std::string Directory(bool shared) {
    char path[4096] = {};
    if (!shared || rank_ == 0) {
      std::string pattern = ::testing::TempDir() + "/gradsync_elastic_XXXXXX";
      std::copy(pattern.begin(), pattern.end(), path);
      EXPECT_NE(mkdtemp(path), nullptr);
    }
    if (shared) MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, MPI_COMM_WORLD);
    return path;
  }
};

std::string StateOf(int64_t step) {
  std::string bytes = "step " + std::to_string(step);
  bytes.push_back('\0');  // binary state: bytes after a zero must survive
  bytes += std::string(1000, static_cast<char>('a' + step % 26));
  return bytes;
}

bool WaitForCommit(const std::string& directory, int64_t number) {
  const auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
  while (elastic::LatestCommit(directory) < number) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST_F(ElasticTest, CommitFilesAreWholeNumberedAndPruned) {
  const std::string dir = Directory(/*shared=*/false) + "/deeper/commits";
  EXPECT_EQ(elastic::LatestCommit(dir), -1);
  for (int64_t n = 1; n <= 3; ++n) ASSERT_TRUE(elastic::WriteCommit(dir, n, StateOf(n)).ok());
  // A writer killed mid-commit leaves a temporary file; it is no commit.
  std::ofstream(dir + "/commit-0000000009.bin.host.1.tmp") << "half";
  std::ofstream(dir + "/commit-12.bin") << "not a commit's name";
  EXPECT_EQ(elastic::ListCommits(dir), (std::vector<int64_t>{2, 3}));
  std::string bytes;
  ASSERT_TRUE(elastic::ReadCommit(dir, 3, &bytes).ok());
  EXPECT_EQ(bytes, StateOf(3));
  EXPECT_FALSE(elastic::ReadCommit(dir, 1, &bytes).ok());  // pruned
  EXPECT_FALSE(elastic::WriteCommit("/proc/no/such/place", 1, "x").ok());
}

// The temporary files of this host's writers that were killed mid-commit go with the next
// commit; another host's, and a live writer's, stay.
TEST_F(ElasticTest, AKilledWritersTemporaryFileIsRemovedByTheNextCommit) {
  const std::string dir = Directory(/*shared=*/false) + "/leftovers";
  ASSERT_TRUE(elastic::WriteCommit(dir, 1, StateOf(1)).ok());
  char host[256] = "host";
  gethostname(host, sizeof(host) - 1);
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // a pid no process has now
  const std::string stem = dir + "/commit-0000000002.bin.";
  const std::string dead = stem + host + "." + std::to_string(child) + ".tmp";
  const std::string live = stem + host + "." + std::to_string(getppid()) + ".tmp";
  const std::string elsewhere = stem + "another-host." + std::to_string(child) + ".tmp";
  for (const std::string& path : {dead, live, elsewhere}) std::ofstream(path) << "half";
  ASSERT_TRUE(elastic::WriteCommit(dir, 2, StateOf(2)).ok());
  EXPECT_NE(access(dead.c_str(), F_OK), 0) << dead;
  EXPECT_EQ(access(live.c_str(), F_OK), 0) << live;
  EXPECT_EQ(access(elsewhere.c_str(), F_OK), 0) << elsewhere;
}

TEST_F(ElasticTest, ANewWorldResumesFromTheLastCommitOnASharedDirectory) {
  const std::string dir = Directory(/*shared=*/true);
  setenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR", dir.c_str(), 1);
  elastic::Resumed first = elastic::resume();
  EXPECT_EQ(first.commit, -1);
  EXPECT_TRUE(first.state.empty());
  for (int64_t step = 1; step <= 4; ++step) EXPECT_FALSE(elastic::commit(StateOf(step)));
  ASSERT_TRUE(WaitForCommit(dir, 4));  // the writer may have skipped 2 or 3, never 4
  barrier().wait();
  elastic::Resumed again = elastic::resume();
  EXPECT_EQ(again.commit, 4);
  EXPECT_EQ(again.source_rank, 0);
  EXPECT_EQ(again.state, StateOf(4));
  // Later commits are numbered after the one resumed from.
  EXPECT_FALSE(elastic::commit(StateOf(5)));
  ASSERT_TRUE(WaitForCommit(dir, 5));
  barrier().wait();
}

TEST_F(ElasticTest, LeavingAfterAFailedWriteThrowsRatherThanAskForARestart) {
  // A checkpoint directory under a regular file, where every write fails.
  const std::string dir = Directory(/*shared=*/false);
  const std::string file = dir + "/not_a_directory";
  std::ofstream(file) << "x";
  setenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR", (file + "/commits").c_str(), 1);
  EXPECT_FALSE(elastic::commit(StateOf(1)));
  // One rank a host writes; leaving would end the test's process with kExitRestart.
  if (local_rank() == 0) {
    EXPECT_THROW(elastic::leave_for_restart(), Error);
  }
  barrier().wait();
}

TEST_F(ElasticTest, TheNewestCommitComesFromTheRankThatHoldsIt) {
  // Node-local directories: the last rank's holds commit 7, the others' older ones.
  const std::string dir = Directory(/*shared=*/false);
  setenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR", dir.c_str(), 1);
  const int64_t mine = rank_ == size_ - 1 ? 7 : 5 + rank_ % 2;
  ASSERT_TRUE(elastic::WriteCommit(dir, mine, StateOf(mine) + std::to_string(rank_)).ok());
  elastic::Resumed resumed = elastic::resume();
  EXPECT_EQ(resumed.commit, 7);
  EXPECT_EQ(resumed.source_rank, size_ - 1);
  EXPECT_EQ(resumed.state, StateOf(7) + std::to_string(size_ - 1));
}

// Answers every request with {"version": 1} until stopped: the launcher's endpoint once the hosts
// have changed.
class FakeLauncher {
 public:
  FakeLauncher() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    socklen_t length = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    listen(fd_, 8);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        const int client = accept(fd_, nullptr, nullptr);
        if (client < 0) continue;
        char request[1024];
        recv(client, request, sizeof(request), 0);
        const std::string body = "{\"version\": 1}";
        const std::string reply =
            "HTTP/1.0 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        send(client, reply.data(), reply.size(), MSG_NOSIGNAL);
        close(client);
      }
    });
  }
  ~FakeLauncher() {
    stop_.store(true);
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(ElasticTest, OtherHostsReachEveryRankAtTheSameCommit) {
  EXPECT_FALSE(elastic::under_launcher());
  std::unique_ptr<FakeLauncher> launcher;
  if (rank_ == 0) {
    launcher = std::make_unique<FakeLauncher>();
    setenv("GRADSYNC_ELASTIC_DRIVER", ("127.0.0.1:" + std::to_string(launcher->port())).c_str(), 1);
  } else {
    setenv("GRADSYNC_ELASTIC_DRIVER", "127.0.0.1:9", 1);  // only rank 0 asks
  }
  setenv("GRADSYNC_ELASTIC_HOSTS_VERSION", "0", 1);
  EXPECT_TRUE(elastic::under_launcher());
  bool changed = false;
  for (int step = 0; step < 2000 && !changed; ++step) {
    changed = elastic::commit(StateOf(step));
    // Every rank has the same answer at every commit.
    int32_t mine = changed ? 1 : 0, lowest = 0, highest = 0;
    MPI_Allreduce(&mine, &lowest, 1, MPI_INT32_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &highest, 1, MPI_INT32_T, MPI_MAX, MPI_COMM_WORLD);
    ASSERT_EQ(lowest, highest) << "at commit " << step;
    if (!changed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(changed) << "the announcement never reached the ranks";
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
