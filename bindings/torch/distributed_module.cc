#include "gradsync/torch.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#ifdef GRADSYNC_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <exception>
#include <functional>
#include <stdexcept>
#include <unordered_set>
#include <utility>

namespace gradsync {
namespace torch {
namespace {

// gradsync's dtype of `t`; false where gradsync carries none (bool, int16, complex).
bool CarriedType(const ::torch::Tensor& t, DataType* dtype) {
  switch (t.scalar_type()) {
    case ::torch::kUInt8:
      *dtype = DataType::kUInt8;
      return true;
    case ::torch::kInt8:
      *dtype = DataType::kInt8;
      return true;
    case ::torch::kInt32:
      *dtype = DataType::kInt32;
      return true;
    case ::torch::kInt64:
      *dtype = DataType::kInt64;
      return true;
    case ::torch::kFloat16:
      *dtype = DataType::kFloat16;
      return true;
    case ::torch::kBFloat16:
      *dtype = DataType::kBFloat16;
      return true;
    case ::torch::kFloat32:
      *dtype = DataType::kFloat32;
      return true;
    case ::torch::kFloat64:
      *dtype = DataType::kFloat64;
      return true;
    default:
      return false;
  }
}

DataType DataTypeOf(const ::torch::Tensor& t) {
  DataType dtype = DataType::kFloat32;
  if (!CarriedType(t, &dtype)) {
    throw Error(Status::InvalidArgument(std::string("gradsync cannot reduce tensors of ") +
                                        c10::toString(t.scalar_type())));
  }
  return dtype;
}

// gradsync's view of a contiguous tensor.
TensorView View(const ::torch::Tensor& t) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  const Device device = t.is_cuda() ? Device::Cuda(t.device().index()) : Device::Cpu();
  return TensorView(t.data_ptr(), DataTypeOf(t), std::move(shape), device);
}

// The stream current on a CUDA tensor's device (a cudaStream_t): where backward's kernels that
// made a gradient may still be queued, and where the optimizer's kernels that read it will be.
// gradsync orders its own stream after it, and it after gradsync's, on the device, so that the
// hooks and synchronize() never wait for the GPU on the host, as DDP's never do.
void* CurrentStream(const ::torch::Tensor& t) {
#ifdef GRADSYNC_TORCH_CUDA
  cudaStream_t current = c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
  // libtorch's default stream is the legacy one, handle 0, which gradsync reads as "no stream".
  return current != nullptr ? current : cudaStreamLegacy;
#else
  (void)t;
  throw Error(Status::InvalidArgument(
      "a CUDA gradient reached gradsync::torch built against a libtorch without CUDA: rebuild "
      "gradsync against the libtorch that runs the trainer"));
#endif
}

// Records `tensors` on the stream current on their device (Tensor::record_stream), for a caller
// that ordered that stream after gradsync's reading and writing them where they were made on
// another: the caching allocator hands their memory out again on the stream that made them, which
// is ordered after gradsync's only through this one.
void RecordOnCurrentStream(const std::vector<::torch::Tensor>& tensors) {
#ifdef GRADSYNC_TORCH_CUDA
  for (const ::torch::Tensor& t : tensors) {
    t.record_stream(c10::cuda::getCurrentCUDAStream(t.device().index()));
  }
#else
  (void)tensors;
#endif
}

// Runs `check` before the accumulator it is added to accumulates a gradient: an exception from it
// stops that accumulation (a post-hook runs only after it).
class BeforeAccumulation : public ::torch::autograd::FunctionPreHook {
 public:
  explicit BeforeAccumulation(std::function<void()> check) : check_(std::move(check)) {}
  ::torch::autograd::variable_list operator()(
      const ::torch::autograd::variable_list& grads) override {
    check_();
    return grads;
  }

 private:
  std::function<void()> check_;
};

// Broadcasts each tensor in place (through a contiguous copy where it is not contiguous); a dtype
// gradsync does not reduce (a bool mask, int16, complex) travels as its bytes. CUDA tensors wait
// on the device for the stream current now, where the kernels that wrote them may be queued.
void BroadcastTensors(const std::vector<std::pair<std::string, ::torch::Tensor>>& tensors, int root,
                      const ProcessSet& process_set, const std::string& prefix) {
  ::torch::NoGradGuard no_grad;
  std::vector<::torch::Tensor> wires;
  std::vector<Handle> handles;
  try {
    for (const auto& [name, tensor] : tensors) {
      wires.push_back(tensor.is_contiguous() ? tensor : tensor.contiguous());
      const ::torch::Tensor& wire = wires.back();
      DataType dtype = DataType::kUInt8;
      BroadcastOptions options;
      options.name = prefix + "." + name;
      options.process_set = process_set;
      if (wire.is_cuda()) options.ready.cuda_stream = CurrentStream(wire);
      handles.push_back(broadcast(
          View(CarriedType(wire, &dtype) ? wire : wire.reshape({-1}).view(::torch::kUInt8)), root,
          options));
    }
  } catch (...) {
    // Those already enqueued still write their copies: not let go before they are done.
    for (Handle& h : handles) {
      try {
        h.wait();
      } catch (const Error&) {
      }
    }
    throw;
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    handles[i].wait();
    if (!wires[i].is_same(tensors[i].second)) tensors[i].second.copy_(wires[i]);
  }
}

// The module's parameters (when asked) and buffers, by name; a tensor registered under two names
// (tied weights) once, so that no two broadcasts write it at the same time.
std::vector<std::pair<std::string, ::torch::Tensor>> NamedState(const ::torch::nn::Module& module,
                                                                bool with_parameters) {
  std::vector<std::pair<std::string, ::torch::Tensor>> tensors;
  std::unordered_set<const c10::TensorImpl*> seen;
  auto add = [&](const std::string& name, const ::torch::Tensor& tensor) {
    if (seen.insert(tensor.unsafeGetTensorImpl()).second) tensors.emplace_back(name, tensor);
  };
  if (with_parameters) {
    for (const auto& item : module.named_parameters()) add(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers()) add(item.key(), item.value());
  return tensors;
}

}  // namespace

void broadcast_state(::torch::nn::Module& module, int root, const ProcessSet& process_set,
                     const std::string& name) {
  BroadcastTensors(NamedState(module, true), root, process_set, name + ".state");
}

DistributedModule::DistributedModule(::torch::nn::Module& module, Options options)
    : module_(module), options_(std::move(options)) {
  if (options_.op != ReduceOp::kAverage && options_.op != ReduceOp::kSum) {
    // Others are not a gradient's reduction (Adasum of a flat bucket would weigh its gradients
    // as one tensor).
    throw Error(
        Status::InvalidArgument("DistributedModule reduces gradients with kAverage or "
                                "kSum, not " +
                                ReduceOpName(options_.op)));
  }
  // From the set's first member (a global rank: the global set's is 0).
  broadcast_state(module_, options_.process_set.ranks().front(), options_.process_set,
                  options_.name);
  // A parameter registered twice (a weight tied between two layers) is one tensor, reduced once.
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module_.named_parameters()) {
    const ::torch::Tensor& p = item.value();
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) {
      params_.push_back(p);
      names_.push_back(item.key());
    }
  }
  produced_.assign(params_.size(), false);
  // Buckets in reverse registration order, the order backward usually produces gradients in.
  bucket_of_.assign(params_.size(), 0);
  int64_t filled = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const ::torch::Tensor& p = params_[k];
    const int64_t bytes = p.numel() * p.element_size();
    // A bucket keeps to one device and dtype: its readiness and consumer are one device's stream.
    const bool apart =
        !buckets_.empty() && (p.device() != params_[buckets_.back().params[0]].device() ||
                              p.scalar_type() != params_[buckets_.back().params[0]].scalar_type());
    if (buckets_.empty() || apart || (filled > 0 && filled + bytes > options_.bucket_bytes)) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    filled += bytes;
  }
  if (options_.gradient_as_bucket_view) MakeBucketViews();
  for (size_t k = 0; k < params_.size(); ++k) {
    std::shared_ptr<::torch::autograd::Node> accumulator =
        ::torch::autograd::impl::grad_accumulator(params_[k]);
    if (accumulator == nullptr) {
      throw Error(Status::InvalidArgument("parameter '" + names_[k] +
                                          "' is not a leaf: it has no gradient accumulator"));
    }
    std::weak_ptr<bool> alive = alive_;
    accumulator->add_pre_hook(std::make_unique<BeforeAccumulation>([this, alive, k] {
      if (auto still = alive.lock(); still != nullptr && *still) BeforeGradient(k);
    }));
    accumulator->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
        [this, alive, k](const ::torch::autograd::variable_list& outputs,
                         const ::torch::autograd::variable_list&) {
          if (auto still = alive.lock(); still != nullptr && *still) OnGradientReady(k);
          return outputs;
        }));
    accumulators_.push_back(std::move(accumulator));
  }
}

DistributedModule::~DistributedModule() {
  *alive_ = false;
  std::lock_guard<std::mutex> lock(mu_);
  DrainLaunched();
}

void DistributedModule::DrainLaunched() {
  for (Bucket& bucket : buckets_) {
    for (Handle& h : bucket.handles) {
      try {
        h.wait();
      } catch (...) {  // the step failed already (and a destructor must not throw)
      }
    }
  }
}

void DistributedModule::MakeBucketViews() {
  if (options_.compression != Compression::kNone) {
    throw Error(Status::InvalidArgument(
        "gradient_as_bucket_view needs Compression::kNone: a compressed bucket is a copy"));
  }
  for (const Bucket& bucket : buckets_) {
    const ::torch::Tensor& first = params_[bucket.params.front()];
    DataTypeOf(first);  // throws for a dtype gradsync does not carry
    for (size_t k : bucket.params) {
      const ::torch::Tensor& p = params_[k];
      if (p.scalar_type() != first.scalar_type() || p.device() != first.device() ||
          p.layout() != ::torch::kStrided || !p.is_contiguous()) {
        throw Error(Status::InvalidArgument(
            "gradient_as_bucket_view needs, in each bucket, contiguous dense parameters of one "
            "dtype and device; parameter '" +
            names_[k] + "' differs from its bucket's first"));
      }
    }
  }
  ::torch::NoGradGuard no_grad;
  views_.resize(params_.size());
  // Consecutive buckets of one dtype and device share an allocation, each bucket a whole number
  // of 16 bytes long, so that buckets the runtime fuses lie back to back.
  size_t run = 0;
  for (size_t end = 1; end <= buckets_.size(); ++end) {
    const ::torch::Tensor& first = params_[buckets_[run].params.front()];
    if (end < buckets_.size()) {
      const ::torch::Tensor& next = params_[buckets_[end].params.front()];
      if (next.scalar_type() == first.scalar_type() && next.device() == first.device()) continue;
    }
    const int64_t unit = std::max<int64_t>(1, 16 / static_cast<int64_t>(first.element_size()));
    std::vector<int64_t> lengths;
    int64_t total = 0;
    for (size_t b = run; b < end; ++b) {
      int64_t elements = 0;
      for (size_t k : buckets_[b].params) elements += params_[k].numel();
      lengths.push_back((elements + unit - 1) / unit * unit);
      total += lengths.back();
    }
    const ::torch::Tensor storage = ::torch::zeros({total}, first.options());
    int64_t offset = 0;
    for (size_t b = run; b < end; ++b) {
      Bucket& bucket = buckets_[b];
      bucket.flat = storage.narrow(0, offset, lengths[b - run]);
      offset += lengths[b - run];
      int64_t inside = 0;
      for (size_t k : bucket.params) {
        ::torch::Tensor& p = params_[k];
        // A tensor over the bucket's memory, not an autograd view of it: an optimizer's
        // zero_grad() detaches each gradient in place, which libtorch refuses for a view.
        views_[k] = ::torch::empty({0}, first.options());
        views_[k].set_(storage.storage(), bucket.flat.storage_offset() + inside, p.sizes());
        inside += p.numel();
        if (p.grad().defined()) views_[k].copy_(p.grad());
        p.mutable_grad() = views_[k];
      }
    }
    run = end;
  }
}

void DistributedModule::ReturnToView(size_t k) {
  ::torch::Tensor& grad = params_[k].mutable_grad();
  const ::torch::Tensor& view = views_[k];
  if (grad.defined() && grad.is_same(view)) return;
  ::torch::NoGradGuard no_grad;
  if (grad.defined()) {
    view.copy_(grad);
  } else {
    view.zero_();
  }
  grad = view;
}

void DistributedModule::BeforeGradient(size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  // A second accumulation would race with the reduction of its bucket, which may be under way:
  // refused before it happens, inside no_sync() too (a synchronized backward not yet
  // synchronized).
  if (produced_[param]) {
    throw Error(Status::InvalidArgument(
        "gradsync::torch::DistributedModule: the gradient of parameter '" + names_[param] +
        "' was produced twice before synchronize(); call synchronize() after each backward, and "
        "accumulate over several backward passes inside no_sync() (after a backward that failed "
        "part way, synchronize() on every rank starts afresh)"));
  }
  if (syncing()) produced_[param] = true;
}

void DistributedModule::OnGradientReady(size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!syncing()) return;
  const size_t b = bucket_of_[param];
  if (++buckets_[b].ready == buckets_[b].params.size()) Launch(b);
}

void DistributedModule::Launch(size_t b) {
  ::torch::NoGradGuard no_grad;
  Bucket& bucket = buckets_[b];
  if (bucket.flat.defined()) {
    LaunchFlat(b);
    return;
  }
  std::vector<TensorView> views;
  GroupedAllreduceOptions options;
  options.op = options_.op;
  options.process_set = options_.process_set;
  // A launch that threw part way (in a hook) is made again whole by synchronize().
  bucket.wires.clear();
  for (size_t k : bucket.params) {
    ::torch::Tensor& param = params_[k];
    if (!param.grad().defined()) param.mutable_grad() = ::torch::zeros_like(param);
    const ::torch::Tensor& grad = param.grad();
    ::torch::Tensor wire;
    switch (options_.compression) {
      case Compression::kNone:
        wire = grad.is_contiguous() ? grad : grad.contiguous();
        break;
      case Compression::kFloat16:
        wire = grad.to(::torch::kFloat16).contiguous();
        break;
      case Compression::kBFloat16:
        wire = grad.to(::torch::kBFloat16).contiguous();
        break;
    }
    bucket.wires.push_back(wire);
    views.push_back(View(wire));
    options.names.push_back(options_.name + ".grad." + std::to_string(b) + "." + std::to_string(k));
  }
  // The bucket's gradients and their copies were made on this stream (grouped allreduces keep to
  // one device).
  if (bucket.wires.front().is_cuda()) {
    bucket.producer = CurrentStream(bucket.wires.front());
    options.ready.cuda_stream = bucket.producer;
  }
  bucket.handles = grouped_allreduce(views, options);
  bucket.launched = true;
}

void DistributedModule::LaunchFlat(size_t b) {
  Bucket& bucket = buckets_[b];
  // Gradients backward made anew are copied into their views; those it did not produce add
  // what their views hold, or zeros where they have none.
  for (size_t k : bucket.params) ReturnToView(k);
  AllreduceOptions options;
  options.name = options_.name + ".bucket." + std::to_string(b);
  options.op = options_.op;
  options.process_set = options_.process_set;
  if (bucket.flat.is_cuda()) options.ready.cuda_stream = CurrentStream(bucket.flat);
  bucket.wires.assign(1, bucket.flat);
  bucket.handles.assign(1, allreduce(View(bucket.flat), options));
  bucket.launched = true;
}

void DistributedModule::synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!syncing()) return;  // inside no_sync(): the gradients stay local
  // However this ends, the next backward starts a fresh step: a launch or a wait that throws
  // must not leave every later backward refused as producing its gradients twice, nor let go of
  // copies the runtime may still write.
  struct StartAfresh {
    DistributedModule* module;
    int unwinding = std::uncaught_exceptions();
    ~StartAfresh() {
      if (std::uncaught_exceptions() > unwinding) module->DrainLaunched();
      module->ResetStep();
    }
  } afresh{this};
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!buckets_[b].launched) Launch(b);
  }
  ::torch::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    if (!bucket.wires.empty() && bucket.wires.front().is_cuda()) {
      void* consumer = CurrentStream(bucket.wires.front());
      gradsync::synchronize_stream(bucket.handles, consumer);
      if (consumer != bucket.producer) RecordOnCurrentStream(bucket.wires);
    } else {
      for (Handle& h : bucket.handles) h.wait();
    }
    // Under gradient_as_bucket_view the gradients are the reduced bucket's slices already.
    for (size_t i = 0; !bucket.flat.defined() && i < bucket.params.size(); ++i) {
      ::torch::Tensor& grad = params_[bucket.params[i]].mutable_grad();
      if (!bucket.wires[i].is_same(grad)) grad.copy_(bucket.wires[i]);
    }
  }
}

void DistributedModule::ResetStep() {
  for (Bucket& bucket : buckets_) {
    bucket.wires.clear();
    bucket.producer = nullptr;
    bucket.handles.clear();
    bucket.ready = 0;
    bucket.launched = false;
  }
  produced_.assign(params_.size(), false);
}

void DistributedModule::broadcast_buffers() {
  BroadcastTensors(NamedState(module_, false), options_.process_set.ranks().front(),
                   options_.process_set, options_.name + ".buffers");
}

}  // namespace torch
}  // namespace gradsync
