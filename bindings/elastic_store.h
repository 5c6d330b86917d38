// Durable commits for gradsync::elastic (gradsync/elastic.h): one file per commit,
// `commit-NNNNNNNNNN.bin` in the checkpoint directory, holding the trainer's bytes as they are.
// A commit is written to a temporary file beside its final name, flushed to disk and renamed over
// it, and the directory is flushed: a process killed mid-write leaves a temporary file, never a
// partial commit. The newest two commits are kept. On a shared directory several hosts may write
// the same commit; each rename replaces one whole file with another.
//
// Thread safety: the functions may be called from any thread; a CommitWriter's members from one
// thread (its owner's).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {
namespace elastic {

// The whole commits in `directory`, ascending; none when it does not exist.
std::vector<int64_t> ListCommits(const std::string& directory);
// The newest commit's number, or -1.
int64_t LatestCommit(const std::string& directory);
Status WriteCommit(const std::string& directory, int64_t number, const std::string& bytes);
Status ReadCommit(const std::string& directory, int64_t number, std::string* bytes);

// Writes commits on a thread of its own, newest first: while one is written, a newer one waits,
// and one newer still replaces it.
class CommitWriter {
 public:
  explicit CommitWriter(std::string directory);
  ~CommitWriter();  // finishes the write under way, drops one waiting
  CommitWriter(const CommitWriter&) = delete;
  CommitWriter& operator=(const CommitWriter&) = delete;

  // Fails with the first write that failed since the last call.
  Status Submit(int64_t number, std::string bytes);
  // Waits until every submitted commit is written or replaced; the first failure, if any.
  Status Flush();
  // Flush, waiting at most `seconds`: *done says whether every commit is written or replaced.
  Status FlushFor(double seconds, bool* done);

 private:
  void Run();

  const std::string directory_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool has_next_ = false;
  int64_t next_number_ = 0;
  std::string next_bytes_;
  bool busy_ = false;
  bool stopping_ = false;
  Status failure_;
  std::thread thread_;
};

}  // namespace elastic
}  // namespace gradsync
