// MpiDataPlane: host-memory collectives over MPI on gradsync's data communicator. Each collective
// lives in its own file (allreduce.cc, allgather.cc, broadcast.cc, reducescatter.cc, alltoall.cc).
//
// Owns the host fusion buffer and the node shared memory. Used by the background thread only.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/data_plane.h"
#include "ops/mpi/adasum.h"
#include "ops/mpi/allreduce_calibration.h"
#include "ops/mpi/hierarchical_allreduce.h"
#include "ops/mpi/node_shared_memory.h"
#include "runtime/fusion_buffer.h"
#include "runtime/timeline.h"

namespace gradsync {

class MpiDataPlane : public DataPlane {
 public:
  // Fused allreduces of at most this many ranks of one node may go through node shared memory.
  static constexpr int kSharedMemoryMaxRanks = 64;
  // Whether every rank folds every region (one barrier; each rank reads ranks x bytes) rather than
  // its own slice of each and then everyone's result (two barriers; about 2 x bytes): the former
  // for 2 ranks, and for up to 4 when the bucket is small enough that the barrier costs more than
  // the reads (docs/benchmarks.md, node shared memory).
  static bool FoldEveryRegion(int ranks, size_t bytes) {
    return ranks <= 2 || (ranks <= 4 && bytes < (size_t{256} << 10));
  }

  // `timeline`, when not null, receives each tensor's copies and collectives; it must outlive
  // the plane. `shm_threshold_bytes`: the largest fused allreduce bucket that may go through
  // memory shared by the ranks of a node (0: never). `hierarchical_allreduce`: reduce within each
  // host, then across hosts, when the communicator spans hosts (see hierarchical_allreduce.h).
  explicit MpiDataPlane(MPI_Comm comm, Timeline* timeline = nullptr,
                        int64_t shm_threshold_bytes = 0, bool hierarchical_allreduce = false);

  Status Allreduce(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec) override;
  Status Allgather(TensorEntry* entry, const std::vector<int64_t>& first_dims) override;
  Status Broadcast(TensorEntry* entry, int root) override;
  Status Reducescatter(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                       std::vector<LocalFailure>* local_failures) override;
  Status Alltoall(TensorEntry* entry) override;

  // Collective over the plane's communicator: times reducing tensors alone and in fused buckets
  // on this communicator, through the paths real buckets take (allreduce_calibration.h). With
  // `compare_hierarchical`, where the hierarchical path applies, fused buckets are also timed
  // through it and through the flat path (fused_hierarchical, fused_flat). The smallest size is
  // always timed; each larger one only while the slowest rank's time so far, plus the last size's
  // time scaled by the bytes the next one moves, stays within `budget_seconds`.
  Status Calibrate(bool compare_hierarchical, AllreduceCalibration* out, double budget_seconds);
  // Collective over the plane's communicator: times one allreduce of kPieceProbeBytes in place,
  // whole and in pieces of each of kPieceCandidates, taking turns; each sample is the slowest
  // rank's fastest round, so every rank chooses alike (ChoosePieceBytes, coordinator/cost_model.h).
  Status CalibratePieces(std::vector<PieceSample>* out);

  // Where the hierarchical path applies (several hosts; see hierarchical_allreduce.h), buckets
  // and lone tensors of at least this many bytes take it; 0 (the default) sends them all, and a
  // size beyond any bucket none. Calibration sets it when the choice is left to measurement.
  void set_hierarchical_from_bytes(int64_t bytes) { hierarchical_from_bytes_ = bytes; }
  // Fused buckets through MPI messages of at least two chunks of this many bytes (a multiple of
  // 64) are reduced chunk by chunk, the copies overlapping the reductions
  // (pipelined_allreduce.cc); 0 reduces every bucket whole.
  void set_pipeline_chunk_bytes(int64_t bytes) { pipeline_chunk_bytes_ = bytes; }
  // Every blocking MPI allreduce of the plane (a tensor alone, a fused bucket, the slices across
  // hosts) is issued in pieces of at most this many bytes (AllreduceInPieces); 0 (the default)
  // issues each whole. Set from GRADSYNC_ALLREDUCE_PIECE_BYTES or by calibration (CalibratePieces).
  void set_piece_bytes(int64_t bytes) { piece_bytes_ = bytes; }
  int64_t piece_bytes() const { return piece_bytes_; }
  // Whether the last Allreduce went through node shared memory (the same on every rank).
  bool last_allreduce_shared() const { return last_allreduce_shared_; }
  // Flat until Calibrate(true, ...) has compared the two paths (the plane must have been created
  // with the hierarchical path requested); a layout where it cannot apply is logged at debug level.
  void LeaveHierarchyToCalibration(int64_t never) {
    hierarchical_from_bytes_ = never;
    hierarchical_.set_quiet(true);
  }

 private:
  // A bucket of op=Adasum (ops/mpi/adasum.h), which no other path serves.
  Status AllreduceAdasum(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec);
  Status AllreduceOne(TensorEntry* entry, const ReduceSpec& spec, MPI_Datatype type, MPI_Op op);
  // A lone tensor in pieces, packed into the fusion buffer around the collective a whole tensor of
  // its size takes outside shared memory (hierarchical or flat).
  Status AllreduceOnePacked(TensorEntry* entry, const ReduceSpec& spec, bool hierarchical,
                            MPI_Datatype type, MPI_Op op);
  // A bucket through the fusion buffer and MPI's allreduce on comm_, in the set's pieces: the
  // same MPI calls as one tensor of `total` bytes reduced where it lies.
  Status AllreduceFusedFlat(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                            const std::vector<size_t>& offsets, const std::vector<int64_t>& counts,
                            size_t total, MPI_Datatype type, MPI_Op op);
  Status AllreduceFused(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                        MPI_Datatype type, MPI_Op op);
  // The fused bucket through node shared memory: each rank packs its tensors into its own region,
  // and after one barrier every rank folds all regions straight into its outputs. Every element is
  // folded in rank order on every rank, so every rank gets the same bits.
  Status AllreduceFusedShared(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                              const std::vector<size_t>& offsets,
                              const std::vector<int64_t>& counts);
  // The fused bucket by slices through `memory` (ranks `rank` of `size`), across hosts over
  // `cross` when it is not null; see shared_memory_allreduce.h.
  Status AllreduceFusedSlices(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                              const std::vector<size_t>& offsets,
                              const std::vector<int64_t>& counts, NodeSharedMemory* memory,
                              int rank, int size, MPI_Comm cross, MPI_Datatype type, MPI_Op op);
  // The fused bucket through MPI messages, chunk by chunk; see pipelined_allreduce.cc.
  Status AllreduceFusedPipelined(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                                 const std::vector<size_t>& offsets,
                                 const std::vector<int64_t>& counts, size_t total,
                                 MPI_Datatype type, MPI_Op op);
  // The fused bucket across hosts; see hierarchical_allreduce.h.
  Status AllreduceFusedHierarchical(const std::vector<TensorEntry*>& entries,
                                    const ReduceSpec& spec, const std::vector<size_t>& offsets,
                                    const std::vector<int64_t>& counts, size_t total,
                                    MPI_Datatype type, MPI_Op op);
  // Copies the reduced bucket in `buffer` out to the entries' outputs, scaled by `postscale`.
  void UnpackFused(const std::vector<TensorEntry*>& entries, const std::vector<size_t>& offsets,
                   const std::vector<int64_t>& counts, char* buffer, double postscale);
  // Packs the entries' inputs, scaled by spec.prescale, at `offsets` in `buffer`, zeroing the gaps.
  void PackFused(const std::vector<TensorEntry*>& entries, const ReduceSpec& spec,
                 const std::vector<size_t>& offsets, const std::vector<int64_t>& counts,
                 char* buffer);
  // Whether `bytes` go the hierarchical way (collective the first time: see Applies()).
  Status UseHierarchical(size_t bytes, bool* use);
  // `status` with `what` (the collective and its tensors) in front of its message.
  static Status InContext(const Status& status, const std::string& what);
  // Allocates the output of `shape` (in the input's dtype) through entry->allocator; on success
  // sets entry->output and entry->state->output_shape. An empty output may be nullptr. A failure
  // is local to this rank while the others are already committed to the collective, so callers
  // still take part (receiving into scratch memory) and return the failure afterwards.
  static Status AllocateOutput(TensorEntry* entry, const std::vector<int64_t>& shape);

  MPI_Comm comm_;
  int size_ = 1;
  int rank_ = 0;
  FusionBuffer fusion_buffer_;
  NodeSharedMemory shared_memory_;
  HierarchicalAllreduce hierarchical_;
  int64_t hierarchical_from_bytes_ = 0;
  int64_t pipeline_chunk_bytes_ = 0;
  int64_t piece_bytes_ = 0;
  bool last_allreduce_shared_ = false;
  Timeline* timeline_;
  // AllreduceAdasum's working memory beside the fusion buffer, kept between buckets.
  AdasumScratch adasum_scratch_;
};

}  // namespace gradsync
