// gradsync::torch::DistributedModule with gradient_as_bucket_view: the gradients are views into
// flat buckets that lie back to back, backward accumulates into them, the results are the average
// the module gives without views, and the cases that cannot be views are refused. With views and
// without: tied parameters are reduced once, buckets keep to one dtype, and a gradient produced
// twice before synchronize() throws (inside no_sync() too); buffers of dtypes gradsync does not
// reduce are broadcast. On the host (CPU tensors), at 1, 2 and 4 ranks.
#include <gradsync/torch.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "test/mpi/multi_rank_test.h"

namespace gradsync {
namespace testing {
namespace {

// Parameters of odd sizes in float32 (15, 5, 15 and 3 elements), so that the buckets have tails
// to pad; `branch` only contributes where the forward takes it.
struct Net : ::torch::nn::Module {
  Net() {
    ::torch::manual_seed(7);
    first = register_module("first", ::torch::nn::Linear(3, 5));
    second = register_module("second", ::torch::nn::Linear(5, 3));
    branch = register_module("branch", ::torch::nn::Linear(3, 3));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x, bool take_branch) {
    ::torch::Tensor y = second->forward(::torch::tanh(first->forward(x)));
    return take_branch ? y + branch->forward(x) : y;
  }
  ::torch::nn::Linear first{nullptr}, second{nullptr}, branch{nullptr};
};

::torch::Tensor Input(int rank, int step) {
  ::torch::manual_seed(100 * step + rank);
  return ::torch::randn({4, 3});
}

void Backward(Net& net, int rank, int step, bool take_branch = true) {
  net.forward(Input(rank, step), take_branch).pow(2).mean().backward();
}

// One process's gradients of the ranks' mean loss: what every rank's averaged gradient must be.
std::vector<::torch::Tensor> Expected(int size, int step, bool branch_on_rank_0_only = false) {
  Net net;
  ::torch::Tensor total = ::torch::zeros({});
  for (int r = 0; r < size; ++r) {
    const bool take_branch = !branch_on_rank_0_only || r == 0;
    total = total + net.forward(Input(r, step), take_branch).pow(2).mean();
  }
  (total / size).backward();
  std::vector<::torch::Tensor> grads;
  for (const ::torch::Tensor& p : net.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : ::torch::zeros_like(p));
  }
  return grads;
}

::testing::AssertionResult GradientsAre(Net& net, const std::vector<::torch::Tensor>& expected) {
  const std::vector<::torch::Tensor> params = net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!::torch::allclose(params[i].grad(), expected[i], 0, 1e-6)) {
      return ::testing::AssertionFailure()
             << "parameter " << i << ": " << params[i].grad() << " wanted " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

torch::Options ViewOptions(const std::string& name) {
  torch::Options options;
  options.gradient_as_bucket_view = true;
  options.bucket_bytes = 1;  // a bucket a parameter
  options.name = name;
  return options;
}

// Whether `grad` lies inside `flat`.
bool Inside(const ::torch::Tensor& grad, const ::torch::Tensor& flat) {
  const auto* begin = static_cast<const char*>(flat.data_ptr());
  const auto* at = static_cast<const char*>(grad.data_ptr());
  return at >= begin && at + grad.nbytes() <= begin + flat.nbytes();
}

class DistributedModuleTest : public MultiRankTest {};

TEST_F(DistributedModuleTest, GradientsAreViewsIntoBucketsThatLieBackToBack) {
  Net net;
  torch::DistributedModule sync(net, ViewOptions("views"));
  ASSERT_EQ(sync.num_buckets(), 6u);
  for (size_t b = 0; b + 1 < sync.num_buckets(); ++b) {
    const ::torch::Tensor flat = sync.bucket_view(b);
    EXPECT_EQ(flat.nbytes() % 16, 0u) << "bucket " << b;
    EXPECT_EQ(static_cast<const char*>(flat.data_ptr()) + flat.nbytes(),
              sync.bucket_view(b + 1).data_ptr())
        << "bucket " << b;
  }
  ::torch::optim::SGD optimizer(net.parameters(), 0.0);
  std::vector<::torch::Tensor> previous;
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();  // in place: the views stay the gradients
    Backward(net, rank_, step);
    sync.synchronize();
    EXPECT_TRUE(GradientsAre(net, Expected(size_, step))) << "step " << step;
    std::vector<::torch::Tensor> grads;
    for (const ::torch::Tensor& p : net.parameters()) {
      bool in_a_bucket = false;
      for (size_t b = 0; b < sync.num_buckets(); ++b)
        in_a_bucket |= Inside(p.grad(), sync.bucket_view(b));
      EXPECT_TRUE(in_a_bucket) << "step " << step;
      grads.push_back(p.grad());
    }
    for (size_t i = 0; i < previous.size(); ++i) {
      EXPECT_TRUE(grads[i].is_same(previous[i]))
          << "backward accumulated elsewhere, parameter " << i;
    }
    previous = grads;
  }
  // Each bucket's tail, past its gradient, stays zero.
  for (size_t b = 0; b < sync.num_buckets(); ++b) {
    const ::torch::Tensor flat = sync.bucket_view(b);
    const int64_t used = net.parameters()[net.parameters().size() - 1 - b].numel();
    EXPECT_EQ(::torch::count_nonzero(flat.narrow(0, used, flat.numel() - used)).item<int64_t>(), 0)
        << "bucket " << b;
  }
}

// A gradient set to an undefined tensor (libtorch 2's zero_grad() default) is made anew by
// backward; the hook copies it into its view and makes the view the gradient again.
TEST_F(DistributedModuleTest, AGradientMadeAnewReturnsToItsView) {
  Net net;
  torch::DistributedModule sync(net, ViewOptions("anew"));
  std::vector<::torch::Tensor> views;
  for (const ::torch::Tensor& p : net.parameters()) views.push_back(p.grad());
  for (int step = 0; step < 2; ++step) {
    for (::torch::Tensor& p : net.parameters()) p.mutable_grad() = ::torch::Tensor();
    Backward(net, rank_, step);
    sync.synchronize();
    EXPECT_TRUE(GradientsAre(net, Expected(size_, step))) << "step " << step;
    const std::vector<::torch::Tensor> params = net.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(params[i].grad().is_same(views[i])) << "parameter " << i << ", step " << step;
    }
  }
}

// A parameter that backward did not reach on some ranks, its gradient undefined there,
// contributes zeros, not what its view held from the step before, and gets the average of what
// the others produced, as without views.
TEST_F(DistributedModuleTest, AParameterBackwardDidNotReachContributesZeros) {
  Net net;
  torch::DistributedModule sync(net, ViewOptions("unused"));
  Backward(net, rank_, 1);
  sync.synchronize();  // every view holds a reduced gradient now
  for (::torch::Tensor& p : net.parameters()) p.mutable_grad() = ::torch::Tensor();
  Backward(net, rank_, 0, /*take_branch=*/rank_ == 0);
  sync.synchronize();
  EXPECT_TRUE(GradientsAre(net, Expected(size_, 0, /*branch_on_rank_0_only=*/true)));
}

// Micro-batches under no_sync() accumulate into the views; the synchronized backward reduces the
// sum, as the module without views does.
TEST_F(DistributedModuleTest, NoSyncAccumulatesIntoTheViews) {
  Net with_views, without;
  torch::DistributedModule views_sync(with_views, ViewOptions("nosync.views"));
  torch::Options plain;
  plain.name = "nosync.plain";
  torch::DistributedModule plain_sync(without, plain);
  for (Net* net : {&with_views, &without}) {
    torch::DistributedModule& sync = net == &with_views ? views_sync : plain_sync;
    {
      torch::DistributedModule::NoSync guard = sync.no_sync();
      Backward(*net, rank_, 0);
    }
    Backward(*net, rank_, 1);
    sync.synchronize();
  }
  std::vector<::torch::Tensor> expected;
  for (const ::torch::Tensor& p : without.parameters()) expected.push_back(p.grad());
  EXPECT_TRUE(GradientsAre(with_views, expected));
}

// One linear layer registered twice, as tied weights are: its gradient is the sum of both uses,
// averaged once, with views and without.
struct Tied : ::torch::nn::Module {
  Tied() {
    ::torch::manual_seed(11);
    shared = register_module("encoder", ::torch::nn::Linear(4, 4));
    register_module("decoder", shared);
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    return shared->forward(::torch::tanh(shared->forward(x)));
  }
  ::torch::nn::Linear shared{nullptr};
};

TEST_F(DistributedModuleTest, TiedParametersAreReducedOnce) {
  for (bool views : {false, true}) {
    Tied net;
    ASSERT_EQ(net.parameters().size(), 4u) << "libtorch lists a tied parameter twice";
    torch::Options options = ViewOptions(views ? "tied.views" : "tied.plain");
    options.gradient_as_bucket_view = views;
    torch::DistributedModule sync(net, options);
    EXPECT_EQ(sync.num_buckets(), 2u);
    ::torch::manual_seed(rank_);
    net.forward(::torch::randn({2, 4})).sum().backward();
    sync.synchronize();
    Tied alone;
    ::torch::Tensor total = ::torch::zeros({});
    for (int r = 0; r < size_; ++r) {
      ::torch::manual_seed(r);
      total = total + alone.forward(::torch::randn({2, 4})).sum();
    }
    (total / size_).backward();
    const std::vector<::torch::Tensor> got = net.parameters();
    const std::vector<::torch::Tensor> want = alone.parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(::torch::allclose(got[i].grad(), want[i].grad(), 0, 1e-6))
          << (views ? "views" : "plain") << ", parameter " << i;
    }
  }
}

// Two backward passes before synchronize(): the second accumulation would race with the first's
// reduction, so a hook refuses it before it happens (the gradients are the first backward's,
// averaged); after synchronize() the module goes on.
TEST_F(DistributedModuleTest, AGradientProducedTwiceBeforeSynchronizeThrows) {
  for (bool views : {false, true}) {
    Net net;
    torch::Options options = ViewOptions(views ? "twice.views" : "twice.plain");
    options.gradient_as_bucket_view = views;
    torch::DistributedModule sync(net, options);
    Backward(net, rank_, 0);
    try {
      Backward(net, rank_, 1);
      ADD_FAILURE() << "the second backward did not throw";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("produced twice"), std::string::npos) << e.what();
    }
    sync.synchronize();
    EXPECT_TRUE(GradientsAre(net, Expected(size_, 0))) << (views ? "views" : "plain");
    for (::torch::Tensor& p : net.parameters()) p.mutable_grad().zero_();
    Backward(net, rank_, 2);
    sync.synchronize();
    EXPECT_TRUE(GradientsAre(net, Expected(size_, 2))) << (views ? "views" : "plain");
  }
}

// A synchronize() that throws (here: the runtime was shut down under it, so the bucket that
// backward did not reach cannot be enqueued) still ends the step: after init() again, the next
// backward is not refused as producing its gradients twice, and its results are right.
TEST_F(DistributedModuleTest, ASynchronizeThatThrowsStillEndsTheStep) {
  Net net;
  torch::DistributedModule sync(net, ViewOptions("afresh"));
  Backward(net, rank_, 0, /*take_branch=*/false);  // the branch's buckets wait for synchronize()
  shutdown();
  EXPECT_THROW(sync.synchronize(), Error);
  init();
  for (::torch::Tensor& p : net.parameters()) p.mutable_grad().zero_();
  Backward(net, rank_, 1);
  sync.synchronize();
  EXPECT_TRUE(GradientsAre(net, Expected(size_, 1)));
}

TEST_F(DistributedModuleTest, WhatCannotBeAViewIsRefused) {
  Net compressed;
  torch::Options options = ViewOptions("refused.fp16");
  options.compression = torch::Compression::kFloat16;
  EXPECT_TRUE(ThrowsWith([&] { torch::DistributedModule sync(compressed, options); },
                         StatusCode::kInvalidArgument, "Compression::kNone"));
}

// A float64 layer between float32 ones: with room for every parameter in one bucket, the buckets
// still keep to one dtype (and device), with views and without, and the averages are right.
struct Mixed : ::torch::nn::Module {
  Mixed() {
    ::torch::manual_seed(5);
    first = register_module("first", ::torch::nn::Linear(3, 4));
    middle = register_module("middle", ::torch::nn::Linear(4, 4));
    last = register_module("last", ::torch::nn::Linear(4, 2));
    middle->to(::torch::kFloat64);
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    ::torch::Tensor h = ::torch::tanh(first->forward(x)).to(::torch::kFloat64);
    return last->forward(::torch::tanh(middle->forward(h)).to(::torch::kFloat32));
  }
  ::torch::nn::Linear first{nullptr}, middle{nullptr}, last{nullptr};
};

TEST_F(DistributedModuleTest, BucketsKeepToOneDtype) {
  for (bool views : {false, true}) {
    Mixed net;
    torch::Options options = ViewOptions(views ? "mixed.views" : "mixed.plain");
    options.gradient_as_bucket_view = views;
    options.bucket_bytes = int64_t{1} << 20;
    torch::DistributedModule sync(net, options);
    EXPECT_EQ(sync.num_buckets(), 3u);
    ::torch::manual_seed(rank_);
    net.forward(::torch::randn({2, 3})).pow(2).sum().backward();
    sync.synchronize();
    Mixed alone;
    ::torch::Tensor total = ::torch::zeros({});
    for (int r = 0; r < size_; ++r) {
      ::torch::manual_seed(r);
      total = total + alone.forward(::torch::randn({2, 3})).pow(2).sum();
    }
    (total / size_).backward();
    const std::vector<::torch::Tensor> got = net.parameters();
    const std::vector<::torch::Tensor> want = alone.parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(::torch::allclose(got[i].grad(), want[i].grad(), 0, 1e-6))
          << (views ? "views" : "plain") << ", parameter " << i;
    }
  }
}

// A bool buffer (a mask) and an int16 one are broadcast as their bytes: rank 0's everywhere.
struct Masked : ::torch::nn::Module {
  explicit Masked(int rank) {
    layer = register_module("layer", ::torch::nn::Linear(2, 2));
    mask = register_buffer("mask", ::torch::tensor({rank == 0, false, true}));
    counts = register_buffer("counts", ::torch::full({2, 3}, rank + 7, ::torch::kInt16));
  }
  ::torch::nn::Linear layer{nullptr};
  ::torch::Tensor mask, counts;
};

TEST_F(DistributedModuleTest, BuffersGradsyncDoesNotReduceAreBroadcastAsBytes) {
  Masked net(rank_);
  torch::Options options;
  options.name = "masked";
  torch::DistributedModule sync(net, options);
  EXPECT_TRUE(::torch::equal(net.mask, ::torch::tensor({true, false, true})));
  EXPECT_TRUE(::torch::equal(net.counts, ::torch::full({2, 3}, 7, ::torch::kInt16)));
}

// Guards nest; a backward inside no_sync() before the synchronized one was synchronized would
// accumulate into gradients under reduction: refused, as a second synchronized backward is.
TEST_F(DistributedModuleTest, NoSyncGuardsNestAndKeepToTheirPlace) {
  Net net, alone;
  torch::Options options;
  options.name = "nosync.nested";
  torch::DistributedModule sync(net, options);
  {
    torch::DistributedModule::NoSync outer = sync.no_sync();
    { torch::DistributedModule::NoSync inner = sync.no_sync(); }
    Backward(net, rank_, 0);  // still inside the outer guard: local
  }
  Backward(net, rank_, 1);
  try {
    torch::DistributedModule::NoSync late = sync.no_sync();
    Backward(net, rank_, 2);
    ADD_FAILURE() << "a backward inside no_sync() before synchronize() did not throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("produced twice"), std::string::npos) << e.what();
  }
  sync.synchronize();
  ::torch::Tensor total = ::torch::zeros({});
  for (int r = 0; r < size_; ++r) {
    for (int step : {0, 1}) total = total + alone.forward(Input(r, step), true).pow(2).mean();
  }
  (total / size_).backward();
  std::vector<::torch::Tensor> expected;
  for (const ::torch::Tensor& p : alone.parameters()) expected.push_back(p.grad());
  EXPECT_TRUE(GradientsAre(net, expected));
}

TEST_F(DistributedModuleTest, OnlyAveragesAndSumsReduceGradients) {
  Net net;
  torch::Options options = ViewOptions("refused.adasum");
  options.op = ReduceOp::kAdasum;
  EXPECT_TRUE(ThrowsWith([&] { torch::DistributedModule sync(net, options); },
                         StatusCode::kInvalidArgument, "kAverage or kSum, not adasum"));
}

}  // namespace
}  // namespace testing
}  // namespace gradsync
