// A libtorch trainer outside the tree: one synchronized step of a linear model on two ranks.
#include <gradsync/torch.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  gradsync::init();
  torch::manual_seed(gradsync::rank());
  torch::nn::Linear model(4, 1);
  gradsync::torch::DistributedModule sync(*model);
  // Rank r's loss is (r + 1) times the sum of the outputs: the averaged bias gradient is known.
  const torch::Tensor x = torch::ones({1, 4});
  (model->forward(x).sum() * (gradsync::rank() + 1)).backward();
  sync.synchronize();
  const int n = gradsync::size();
  const float expected = (n + 1) / 2.0f;
  const bool ok = std::abs(model->bias.grad().item<float>() - expected) < 1e-6f;
  if (gradsync::rank() == 0)
    std::printf("libtorch consumer: %d ranks: %s\n", n, ok ? "ok" : "WRONG");
  gradsync::shutdown();
  return ok ? 0 : 1;
}
