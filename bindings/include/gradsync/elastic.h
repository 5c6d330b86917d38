// gradsync::elastic: elastic training for C++ trainers, under gradsyncrun --min-np/--max-np
// (docs/elastic.md). The launcher runs the job as a sequence of worlds; each world resumes from the
// newest commit of the ones before. The protocol is gradsync.torch.elastic's: commits are files in
// the launcher's checkpoint directory, written whole or not at all; a new world loads the newest
// any rank holds and broadcasts it; when the launcher announces other hosts, every rank learns it
// at the same commit, and the ranks leave together with kExitRestart.
//
// The state is the trainer's own bytes (parameters, optimizer state, counters, as it serializes
// them), the same on every rank at a commit, as synchronous data-parallel training keeps them.
//
// Thread safety: call from the thread that calls gradsync's collectives, after init(), at the same
// points of the program on every rank (resume and commit are collectives).
#pragma once

#include <cstdint>
#include <string>

namespace gradsync {
namespace elastic {

// The exit status with which every rank leaves a world whose hosts changed, once its commits are
// on disk: gradsyncrun then starts the next world at once.
constexpr int kExitRestart = 75;

struct Resumed {
  int64_t commit = -1;  // the commit's number; -1 when no rank holds one (the job's first world)
  int source_rank = 0;  // the rank that read it and broadcast it
  std::string state;    // the bytes commit() was given; empty when there is none
};

// Collective. The newest commit any rank can read in the checkpoint directory
// (GRADSYNC_ELASTIC_CHECKPOINT_DIR, which gradsyncrun sets), the same on every rank. Later commits
// are numbered after it.
Resumed resume();

// Collective, at the same step on every rank. Makes `state` the next commit: one rank per host
// writes it to disk on a thread of its own, so the call costs a copy's hand-off (the write waits
// for no one; a newer commit replaces one not yet started). Returns true, on every rank at the
// same commit, once the launcher has announced other hosts: call leave_for_restart() then.
// Throws Error when an earlier write failed.
bool commit(std::string state);

// Waits until this rank's commits are on disk and every rank has got that far (a barrier), shuts
// gradsync down and ends the process with kExitRestart. Throws Error, and does not leave, when a
// commit of this rank's could not be written.
[[noreturn]] void leave_for_restart();

// Whether this process runs in a world of gradsyncrun's elastic mode.
bool under_launcher();

}  // namespace elastic
}  // namespace gradsync
