// gradsync for libtorch trainers: a module's gradients reduced across ranks as backward produces
// them, in about two lines of the trainer.
//
//   gradsync::torch::DistributedModule sync(model);   // broadcasts rank 0's state, hooks grads
//   ...
//   loss.backward();
//   sync.synchronize();                               // every reduction done, results in .grad()
//   optimizer.step();
//
// Each parameter's gradient accumulator gets a hook that runs once backward has accumulated its
// gradient. Gradients are grouped into buckets of about Options::bucket_bytes, in reverse
// registration order (the order backward produces them); a bucket is enqueued as one grouped
// allreduce as soon as its last gradient is ready, so reductions overlap the rest of backward.
// synchronize() enqueues what backward did not reach (parameters left unused contribute zeros),
// waits, and writes the results into the gradients.
//
// CUDA gradients never stall the host: a bucket's reduction waits on the device for the stream
// that was current when backward made its gradients, and synchronize() orders the current
// stream after the reductions (the host blocks only until they are launched), so the optimizer's
// kernels queued there read reduced gradients. Work on another stream must wait for that one.
//
// Thread safety: one trainer thread drives a DistributedModule (the hooks run on the thread that
// runs backward). gradsync must be initialized first and outlive the object.
#pragma once

#include <gradsync/gradsync.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gradsync {
namespace torch {

// How gradients travel: as they are, or halved to 16 bits for the reduction and restored after.
enum class Compression { kNone, kFloat16, kBFloat16 };

struct Options {
  // kAverage (the mean over ranks, as DDP) or kSum.
  ReduceOp op = ReduceOp::kAverage;
  // Gradients are grouped into buckets of about this many bytes (DDP's bucket_cap_mb).
  int64_t bucket_bytes = int64_t{25} << 20;
  Compression compression = Compression::kNone;
  ProcessSet process_set;
  // Prefix of the collectives' names: distinct for each DistributedModule of a process.
  std::string name = "module";
};

// Overwrites every parameter and buffer of `module` with the root's (a global rank, a member of
// `process_set`).
void broadcast_state(::torch::nn::Module& module, int root = 0,
                     const ProcessSet& process_set = ProcessSet(),
                     const std::string& name = "module");

class DistributedModule {
 public:
  // Collective: broadcasts rank 0's parameters and buffers, then hooks every parameter that
  // requires a gradient.
  explicit DistributedModule(::torch::nn::Module& module, Options options = {});
  // The hooks stay registered with the accumulators but do nothing afterwards.
  ~DistributedModule();
  DistributedModule(const DistributedModule&) = delete;
  DistributedModule& operator=(const DistributedModule&) = delete;

  // Enqueues every bucket backward did not, waits for all, and writes the reduced values into the
  // gradients. Call after backward and before the optimizer step. Throws gradsync::Error.
  void synchronize();

  // While the returned guard lives, backward accumulates gradients locally and reduces nothing
  // (DDP's no_sync): the first backward after it reduces the accumulated gradients.
  class NoSync {
   public:
    explicit NoSync(DistributedModule* owner) : owner_(owner) { owner_->syncing_ = false; }
    ~NoSync() { owner_->syncing_ = true; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedModule* owner_;
  };
  NoSync no_sync() { return NoSync(this); }

  // Rank 0's buffers (BatchNorm's running statistics) to every rank.
  void broadcast_buffers();

  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    size_t ready = 0;            // gradients ready in the current backward
    bool launched = false;
    std::vector<::torch::Tensor> wires;  // what is reduced (the gradients, or their 16-bit copies)
    std::vector<Handle> handles;
  };

  void OnGradientReady(size_t param);
  // Enqueues bucket `b` (its gradients, zeros for those backward did not produce).
  void Launch(size_t b);

  ::torch::nn::Module& module_;
  Options options_;
  std::vector<::torch::Tensor> params_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::mutex mu_;
  bool syncing_ = true;
};

}  // namespace torch
}  // namespace gradsync
