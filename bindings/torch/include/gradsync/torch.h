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
// waits, and writes the results into the gradients. A parameter registered twice (tied weights)
// is reduced once. A gradient produced twice before synchronize() (two backward passes, or a
// parameter in two reentrant checkpointed segments) throws from a hook that runs before it is
// accumulated, as DDP raises: its bucket may already be in flight.
//
// With Options::gradient_as_bucket_view (DDP's option of that name) each bucket is one flat
// tensor and the parameters' gradients are views into it: backward accumulates into the buckets
// themselves, a bucket is reduced in place as one tensor, and synchronize() copies nothing. The
// buckets are adjacent slices of one allocation per dtype and device, so a GPU bucket that the
// runtime fuses from several is still reduced where it lies. Zero gradients in place between
// steps (libtorch 1.x's zero_grad(); zero_grad(false) in 2.x): a gradient that backward made
// anew (after it was set to an undefined tensor) is copied into its view by the hook, which
// makes the view the gradient again, as DDP's does.
//
// CUDA gradients never stall the host: a bucket's reduction waits on the device for the stream
// that was current when backward made its gradients, and synchronize() orders the current
// stream after the reductions (the host blocks only until they are launched), so the optimizer's
// kernels queued there read reduced gradients. Work on another stream must wait for that one.
//
// Which parameters are reduced, and on which device and dtype, is fixed when the object is made:
// make it after the module is on its device and after freezing (requires_grad) is decided. A
// parameter no rank produced a gradient for in a step gets zeros, which an optimizer with momentum
// or weight decay still applies (DDP leaves such a gradient undefined).
//
// Thread safety: one trainer thread drives a DistributedModule (the hooks run on the threads that
// run backward: the caller's, and autograd's device threads for CUDA gradients, one at a time).
// gradsync must be initialized first and outlive the object.
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
  // kAverage (the mean over ranks, as DDP) or kSum; the constructor refuses others.
  ReduceOp op = ReduceOp::kAverage;
  // Gradients are grouped into buckets of about this many bytes (DDP's bucket_cap_mb).
  int64_t bucket_bytes = int64_t{25} << 20;
  Compression compression = Compression::kNone;
  ProcessSet process_set;
  // Prefix of the collectives' names: distinct for each DistributedModule of a process.
  std::string name = "module";
  // Gradients as views into flat buckets (above). Needs no compression and, in each bucket,
  // contiguous parameters of one dtype and device; the constructor throws InvalidArgument
  // otherwise.
  bool gradient_as_bucket_view = false;
};

// Overwrites every parameter and buffer of `module` with the root's (a global rank, a member of
// `process_set`).
void broadcast_state(::torch::nn::Module& module, int root = 0,
                     const ProcessSet& process_set = ProcessSet(),
                     const std::string& name = "module");

class DistributedModule {
 public:
  // Collective: broadcasts rank 0's parameters and buffers, then hooks every parameter that
  // requires a gradient. Buckets keep to one device and dtype.
  explicit DistributedModule(::torch::nn::Module& module, Options options = {});
  // Waits for the reductions still in flight (a backward that threw part way), dropping their
  // errors; the hooks stay registered with the accumulators but do nothing afterwards.
  ~DistributedModule();
  DistributedModule(const DistributedModule&) = delete;
  DistributedModule& operator=(const DistributedModule&) = delete;

  // Enqueues every bucket backward did not, waits for all, and writes the reduced values into the
  // gradients. Call after backward and before the optimizer step. Throws gradsync::Error.
  void synchronize();

  // While the returned guard lives (guards may nest), backward accumulates gradients locally and
  // reduces nothing (DDP's no_sync): the first backward after it reduces the accumulated
  // gradients. A backward inside it before synchronize() of a synchronized one is refused.
  class NoSync {
   public:
    explicit NoSync(DistributedModule* owner) : owner_(owner) { ++owner_->no_sync_depth_; }
    ~NoSync() { --owner_->no_sync_depth_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedModule* owner_;
  };
  NoSync no_sync() { return NoSync(this); }

  // Rank 0's buffers (BatchNorm's running statistics) to every rank.
  void broadcast_buffers();

  size_t num_buckets() const { return buckets_.size(); }
  // Bucket `b`'s flat tensor under gradient_as_bucket_view (an undefined tensor without it): the
  // parameters' gradients are slices of it, in the bucket's order, its tail (up to a multiple of
  // 16 bytes) zeros.
  ::torch::Tensor bucket_view(size_t b) const { return buckets_.at(b).flat; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    size_t ready = 0;            // gradients ready in the current backward
    bool launched = false;
    std::vector<::torch::Tensor> wires;  // what is reduced (the gradients, or their 16-bit copies)
    void* producer = nullptr;            // a CUDA bucket's: the stream its wires were made on
    std::vector<Handle> handles;
    ::torch::Tensor flat;  // gradient_as_bucket_view's
  };

  // The accumulator's pre-hook: refuses a gradient produced twice before synchronize().
  void BeforeGradient(size_t param);
  // The post-hook: counts the gradient in and launches its bucket when it is the last.
  void OnGradientReady(size_t param);
  // Enqueues bucket `b` (its gradients, zeros for those backward did not produce).
  void Launch(size_t b);
  void LaunchFlat(size_t b);
  // gradient_as_bucket_view: allocates the buckets' flat tensors and makes each gradient its view.
  void MakeBucketViews();
  // Makes parameter `k`'s gradient its view again where backward made it elsewhere (a copy), or
  // zeros where there is none. The hook then copies nothing once the gradients are their views.
  void ReturnToView(size_t k);
  // Forgets the step's buckets and gradients (synchronize()'s end, even when it throws).
  void ResetStep();
  // Waits for every launched bucket's reduction on the host, dropping errors: before memory the
  // runtime may still write is let go after a failure.
  void DrainLaunched();
  bool syncing() const { return no_sync_depth_ == 0; }

  ::torch::nn::Module& module_;
  Options options_;
  std::vector<::torch::Tensor> params_;
  std::vector<std::string> names_;  // params_'s names in the module, for errors
  std::vector<size_t> bucket_of_;
  std::vector<bool> produced_;  // per parameter: its gradient came in this synchronized backward
  std::vector<::torch::Tensor> views_;  // per parameter, under gradient_as_bucket_view
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::mutex mu_;
  int no_sync_depth_ = 0;  // NoSync guards alive
};

}  // namespace torch
}  // namespace gradsync
