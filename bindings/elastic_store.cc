#include "bindings/elastic_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

namespace gradsync {
namespace elastic {

namespace {

constexpr size_t kKeep = 2;
constexpr char kPrefix[] = "commit-";
constexpr char kSuffix[] = ".bin";
constexpr size_t kDigits = 10;

std::string PathOf(const std::string& directory, int64_t number) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s%0*lld%s", kPrefix, static_cast<int>(kDigits),
                static_cast<long long>(number), kSuffix);
  return directory + "/" + name;
}

// The commit number `name` holds, or -1 for any other file (temporary ones included).
int64_t NumberOf(const std::string& name) {
  const size_t prefix = sizeof(kPrefix) - 1, suffix = sizeof(kSuffix) - 1;
  if (name.size() != prefix + kDigits + suffix || name.compare(0, prefix, kPrefix) != 0 ||
      name.compare(prefix + kDigits, suffix, kSuffix) != 0) {
    return -1;
  }
  int64_t number = 0;
  for (size_t i = prefix; i < prefix + kDigits; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    number = number * 10 + (name[i] - '0');
  }
  return number;
}

Status Errno(const std::string& what, const std::string& path) {
  return Status::Internal("elastic commit: " + what + " " + path + ": " + std::strerror(errno));
}

Status MakeDirectories(const std::string& directory) {
  for (size_t at = 1; at <= directory.size(); ++at) {
    if (at != directory.size() && directory[at] != '/') continue;
    const std::string prefix = directory.substr(0, at);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return Errno("cannot make", prefix);
  }
  return Status::OK();
}

Status WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write", path);
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

// Whether process `pid` of this machine still runs (one that cannot be signalled does).
bool Alive(long pid) { return kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

// Removes the temporary files of writers on this host whose process is gone (killed mid-commit):
// each is a commit's size, and a job that restarts often would fill the disk with them. Another
// host's, or a live writer's, are left alone.
void PruneLeftovers(const std::string& directory, const std::string& host) {
  const std::string mark = std::string(kSuffix) + "." + host + ".";
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> gone;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    const size_t at = name.find(mark);
    const size_t tmp = name.rfind(".tmp");
    if (name.compare(0, sizeof(kPrefix) - 1, kPrefix) != 0 || at == std::string::npos ||
        tmp == std::string::npos || tmp + 4 != name.size() || tmp <= at + mark.size()) {
      continue;
    }
    const std::string digits = name.substr(at + mark.size(), tmp - at - mark.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::stol(digits);
    if (pid != static_cast<long>(getpid()) && !Alive(pid)) gone.push_back(directory + "/" + name);
  }
  closedir(dir);
  for (const std::string& path : gone) unlink(path.c_str());
}

}  // namespace

std::vector<int64_t> ListCommits(const std::string& directory) {
  std::vector<int64_t> numbers;
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return numbers;
  while (const dirent* entry = readdir(dir)) {
    const int64_t number = NumberOf(entry->d_name);
    if (number >= 0) numbers.push_back(number);
  }
  closedir(dir);
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

int64_t LatestCommit(const std::string& directory) {
  const std::vector<int64_t> numbers = ListCommits(directory);
  return numbers.empty() ? -1 : numbers.back();
}

Status WriteCommit(const std::string& directory, int64_t number, const std::string& bytes) {
  GRADSYNC_RETURN_IF_ERROR(MakeDirectories(directory));
  const std::string path = PathOf(directory, number);
  char host[256] = "host";
  gethostname(host, sizeof(host) - 1);
  const std::string temporary =
      path + "." + host + "." + std::to_string(static_cast<long>(getpid())) + ".tmp";
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", temporary);
  Status status = WriteAll(fd, bytes, temporary);
  if (status.ok() && fsync(fd) != 0) status = Errno("cannot flush", temporary);
  if (close(fd) != 0 && status.ok()) status = Errno("cannot close", temporary);
  if (status.ok() && rename(temporary.c_str(), path.c_str()) != 0) {
    status = Errno("cannot rename into", path);
  }
  if (!status.ok()) {
    unlink(temporary.c_str());
    return status;
  }
  // The rename is durable once the directory is; some filesystems cannot flush one.
  const int dir_fd = open(directory.c_str(), O_RDONLY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  const std::vector<int64_t> numbers = ListCommits(directory);
  for (size_t i = 0; i + kKeep < numbers.size(); ++i) {
    unlink(PathOf(directory, numbers[i]).c_str());  // another host may have pruned it first
  }
  PruneLeftovers(directory, host);
  return Status::OK();
}

Status ReadCommit(const std::string& directory, int64_t number, std::string* bytes) {
  const std::string path = PathOf(directory, number);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Errno("cannot open", path);
  bytes->clear();
  char chunk[1 << 16];
  size_t n = 0;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) bytes->append(chunk, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Errno("cannot read", path);
  return Status::OK();
}

CommitWriter::CommitWriter(std::string directory)
    : directory_(std::move(directory)), thread_([this] { Run(); }) {}

CommitWriter::~CommitWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status CommitWriter::Submit(int64_t number, std::string bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) return std::exchange(failure_, Status::OK());
  has_next_ = true;
  next_number_ = number;
  next_bytes_ = std::move(bytes);
  cv_.notify_all();
  return Status::OK();
}

Status CommitWriter::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !has_next_ && !busy_; });
  return std::exchange(failure_, Status::OK());
}

Status CommitWriter::FlushFor(double seconds, bool* done) {
  std::unique_lock<std::mutex> lock(mu_);
  *done = cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                       [this] { return !has_next_ && !busy_; });
  return std::exchange(failure_, Status::OK());
}

void CommitWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return has_next_ || stopping_; });
    if (stopping_) return;
    const int64_t number = next_number_;
    std::string bytes = std::move(next_bytes_);
    has_next_ = false;
    busy_ = true;
    lock.unlock();
    const Status written = WriteCommit(directory_, number, bytes);
    lock.lock();
    busy_ = false;
    if (!written.ok() && failure_.ok()) failure_ = written;
    cv_.notify_all();
  }
}

}  // namespace elastic
}  // namespace gradsync
