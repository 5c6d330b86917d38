// CudaBatchedCopier: the batched copy launched on a CUDA stream. A launch of up to
// InlineCopyPlan::kMaxSegments segments passes its descriptors (segments and chunk plan) as the
// kernel's parameter: one launch, no copy. A larger one moves them to the device through pinned
// staging blocks that are reused once the copy that read them has run, so that a launch costs no
// synchronization.
//
// With tables on, a copy of more than kInlineOnly segments that repeats (a locked schedule's
// buckets, step after step) gets a table: its descriptors are written to device memory once, and
// every later launch of the same copy on the same stream passes only their address
// (CopyTableCache decides which copies earn one).
//
// While the stream waits for a producer (a backward pass still computing), every launch takes a
// fresh block, and dozens are in flight at once. They finish in the order they were launched
// (one stream), so a launch asks only the oldest whether it is done, and its cost does not grow
// with the blocks in flight.
//
// Thread safety: one thread at a time (the thread that enqueues on the stream).
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "gradsync/status.h"
#include "gradsync/types.h"
#include "ops/device/batched_copy.h"
#include "ops/device/copy_table_cache.h"

namespace gradsync {

class CudaBatchedCopier {
 public:
  // Copies of at most this many segments always pass their descriptors as the parameter: about
  // 170 B, no dearer to pass than a table's address.
  static constexpr int kInlineOnly = 4;
  // Tables kept at most: a locked plan's buckets twice (in and out), with room to spare.
  static constexpr size_t kTableCapacity = 64;

  // A copier for `device`, the current device, whose kernels are loaded before it returns (see
  // LoadBatchedCopyKernels), so that no launch loads one behind queued work. `tables`: whether
  // repeated copies get tables (GRADSYNC_DEVICE_COPY_TABLES).
  static Status Create(int device, bool tables, std::unique_ptr<CudaBatchedCopier>* copier);
  // Waits for the queued copies that read its memory. Destroy it before the streams it launched
  // on: a table's last readers are known only by recording on its stream.
  ~CudaBatchedCopier();
  CudaBatchedCopier(const CudaBatchedCopier&) = delete;
  CudaBatchedCopier& operator=(const CudaBatchedCopier&) = delete;

  // Enqueues the copy of `segments` (device pointers) on `stream` (a cudaStream_t).
  Status Launch(const std::vector<CopySegment>& segments, DataType dtype, void* stream);

  // Tables held now (for tests).
  size_t tables() const { return table_cache_.size(); }

 private:
  struct Staging {
    void* host = nullptr;    // pinned
    void* device = nullptr;  // what the kernel reads
    size_t capacity = 0;
    void* read = nullptr;  // cudaEvent_t recorded after the last kernel that read it
  };
  // A block of at least `bytes` whose last kernel has run.
  Status Take(size_t bytes, std::unique_ptr<Staging>* block);
  // Moves the blocks whose kernels have run from the front of in_flight_ to free_.
  Status Reclaim();
  // Puts the descriptors of `segments` and their plan `first_chunk` in `block` and queues their
  // copy to the device on `stream`.
  Status Upload(const std::vector<CopySegment>& segments, const std::vector<int64_t>& first_chunk,
                Staging* block, void* stream);
  // Launches the kernel that reads its descriptors from `block` on the device.
  Status LaunchFromDevice(const Staging& block, int num_segments, int64_t total_chunks,
                          DataType dtype, void* stream);
  // Gives a block whose readers are all queued on `stream` to in_flight_, after them.
  Status Retire(std::unique_ptr<Staging> block, void* stream);
  // Launches a copy that earned a table (see CopyTableCache), whose descriptors go to `block`.
  Status LaunchNewTable(const CopyTableCache::Lookup& lookup,
                        const std::vector<CopySegment>& segments, DataType dtype,
                        std::vector<int64_t> first_chunk, std::unique_ptr<Staging> block,
                        void* stream);

  CudaBatchedCopier(int device, bool tables)
      : device_(device), table_cache_(tables ? kTableCapacity : 0) {}

  int device_;
  std::deque<std::unique_ptr<Staging>> in_flight_;  // in the order of their `read` records
  std::vector<std::unique_ptr<Staging>> free_;
  CopyTableCache table_cache_;
  // The blocks that hold tables, with the stream each was uploaded on.
  struct TableBlock {
    std::unique_ptr<Staging> block;
    void* stream;
  };
  std::vector<TableBlock> table_blocks_;
  // Blocks whose readers could not be recorded (a failed cudaEventRecord): freed with the copier.
  std::vector<std::unique_ptr<Staging>> stranded_;
};

}  // namespace gradsync
