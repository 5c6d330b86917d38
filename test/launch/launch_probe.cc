// Starts gradsync and prints where init() placed this rank, or why init() refused the launch;
// launch_checks.py runs it under launches right and wrong.
//   placement rank=R gpu=G process=CPUS thread=CPUS
//   rank R init failed: MESSAGE       (exit status 3)
#include <dirent.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gradsync/gradsync.h"

namespace {

// The "Cpus_allowed_list" line of a /proc status file: the kernel's own view of the affinity.
std::string AllowedCpus(const std::string& status_path) {
  std::ifstream status(status_path);
  const std::string key = "Cpus_allowed_list:";
  for (std::string line; std::getline(status, line);) {
    if (line.compare(0, key.size(), key) != 0) continue;
    const size_t start = line.find_first_not_of(" \t", key.size());
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "?";
}

// The affinity of the thread called `name`. Threads started by that thread inherit its name, and
// a short-lived one may exit between reading its name and its status; such a task is skipped
// rather than reported as unreadable, and the first readable one wins.
std::string ThreadCpus(const std::string& name) {
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return "?";
  std::string found = "none";
  while (dirent* entry = readdir(tasks)) {
    const std::string dir = std::string("/proc/self/task/") + entry->d_name;
    std::ifstream comm(dir + "/comm");
    std::string thread_name;
    if (!std::getline(comm, thread_name) || thread_name != name) continue;
    const std::string cpus = AllowedCpus(dir + "/status");
    if (cpus != "?") {
      found = cpus;
      break;
    }
  }
  closedir(tasks);
  return found;
}

}  // namespace

int main() {
  const char* launcher_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  try {
    gradsync::init();
    // A completed collective means the background thread has run, and so has placed itself.
    std::vector<float> value(1, 1.0f);
    gradsync::allreduce(gradsync::TensorView(value.data(), gradsync::DataType::kFloat32, {1}))
        .wait();
    std::printf("placement rank=%d gpu=%d process=%s thread=%s\n", gradsync::rank(),
                gradsync::gpu_device(), AllowedCpus("/proc/self/status").c_str(),
                ThreadCpus("gradsync-loop").c_str());
    std::fflush(stdout);
    gradsync::shutdown();
  } catch (const std::exception& e) {
    std::printf("rank %s init failed: %s\n", launcher_rank ? launcher_rank : "?", e.what());
    return 3;
  }
  return 0;
}
