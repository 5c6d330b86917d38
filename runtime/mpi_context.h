// MpiContext: gradsync's view of MPI for one runtime instance: the communicators it owns
// (duplicated from the base communicator, so gradsync traffic never meets the application's) and
// the topology.
//
// Created and destroyed by init()/shutdown() on the caller thread; the communicators are used only
// by the background thread in between. The topology getters may be called from any thread.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "gradsync/status.h"

namespace gradsync {

// OK for MPI_SUCCESS; otherwise an MpiError "<call> failed on rank R: <MPI error string>".
Status MpiResult(int rc, const char* call);

// A duplicate of `base` that gradsync owns, so its errors come back as return codes (and become a
// Status) instead of aborting the job under the default MPI_ERRORS_ARE_FATAL handler. Collective
// over `base`; *out stays null on failure.
Status DupWithReturnedErrors(MPI_Comm base, MPI_Comm* out);

// Whether MPI calls may be made now: initialized and not yet finalized. Destructors that free MPI
// handles ask first, since the application may finalize MPI before gradsync lets go of them.
bool MpiUsable();

// Marks `comm` as holding a collective this rank gave up on (a negotiation round abandoned after a
// stall). MPI may still progress that collective if the missing rank joins it later, and Open MPI
// then touches the communicator, so FreeCommunicator never frees it. Thread-safe.
void AbandonCommunicator(MPI_Comm comm);
// MPI_Comm_free, unless `*comm` is null or was abandoned; `*comm` is MPI_COMM_NULL after.
void FreeCommunicator(MPI_Comm* comm);

// Checks an MPI call's return code where it happens and returns its Status on failure.
#define GRADSYNC_MPI_CALL(call) GRADSYNC_RETURN_IF_ERROR(::gradsync::MpiResult((call), #call))

// The CPUs a rank can count on: the `allowed_cpus` it may run on, but no more than its even share
// of the node's `node_cpus` among the node's `local_size` ranks (unbound ranks may all run on every
// CPU); at least 1.
int CoresPerRank(int allowed_cpus, int node_cpus, int local_size);

class MpiContext {
 public:
  // Initializes MPI (asking for MPI_THREAD_MULTIPLE) unless the application already has, then
  // duplicates `base` twice: one communicator for negotiation, one for data.
  static Status Create(MPI_Comm base, std::unique_ptr<MpiContext>* out);
  // Frees the communicators; finalizes MPI only if Create initialized it.
  ~MpiContext();

  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }
  // The lowest rank that shares this rank's memory: the same on every rank of a node, and
  // different between nodes.
  int node_leader() const { return node_leader_; }
  // CoresPerRank for this process. Below 2, the background thread and the caller's thread share a
  // core.
  int cores_per_rank() const { return cores_per_rank_; }
  MPI_Comm control_comm() const { return control_comm_; }
  MPI_Comm data_comm() const { return data_comm_; }
  // The lowest MPI thread level any rank has (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE). Below
  // MPI_THREAD_MULTIPLE gradsync makes its MPI calls from one thread at a time.
  int thread_level() const { return thread_level_; }
  bool calls_mpi_concurrently() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }

 private:
  MpiContext() = default;
  static void FinalizeMpi();

  bool owns_mpi_ = false;
  MPI_Comm control_comm_ = MPI_COMM_NULL;
  MPI_Comm data_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int local_rank_ = 0, local_size_ = 1;
  int cross_rank_ = 0, cross_size_ = 1;
  int node_leader_ = 0;
  int cores_per_rank_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
};

// The negotiation and data communicators of one process set, split from an MpiContext's own (so
// MPI errors on them come back as return codes too); freed on destruction.
class SubsetCommunicators {
 public:
  // Collective over every rank of `mpi`, in the same order as gradsync's other collectives on it.
  // `ranks` are ascending global ranks; a member's rank in the new communicators is its index
  // there. On other ranks both communicators are MPI_COMM_NULL.
  static Status Split(const MpiContext& mpi, const std::vector<int>& ranks,
                      std::unique_ptr<SubsetCommunicators>* out);
  ~SubsetCommunicators();

  SubsetCommunicators(const SubsetCommunicators&) = delete;
  SubsetCommunicators& operator=(const SubsetCommunicators&) = delete;

  MPI_Comm control() const { return control_; }
  MPI_Comm data() const { return data_; }

 private:
  SubsetCommunicators() = default;

  MPI_Comm control_ = MPI_COMM_NULL;
  MPI_Comm data_ = MPI_COMM_NULL;
};

}  // namespace gradsync
