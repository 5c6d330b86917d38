// A small multilayer perceptron in float64 on plain arrays: Linear layers with tanh between them
// and a linear output, trained on mean squared error. It exists to show how a hand-written trainer
// hands each layer's gradients to gradsync the moment backward produces them.
//
// Owns its weights, gradients and the activations of the last forward pass. Not thread-safe: one
// thread drives forward, backward and the update.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace demo {

// Row-major weight [out x in] and bias [out], with gradient buffers of the same shapes.
struct Linear {
  int in = 0;
  int out = 0;
  std::vector<double> weight;
  std::vector<double> bias;
  std::vector<double> grad_weight;
  std::vector<double> grad_bias;
};

// Small deterministic generator (splitmix64) so data and weights are identical on every rank and
// every platform, unlike std::normal_distribution whose output is implementation-defined.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t NextU64();
  double Uniform(double lo, double hi);
  double Normal();

 private:
  uint64_t state_;
};

class Mlp {
 public:
  // widths = {in, hidden..., out}; weights drawn from `seed` with a 1/sqrt(fan_in) scale.
  Mlp(const std::vector<int>& widths, uint64_t seed);

  // Runs `rows` rows of `x` ([rows x in]) and keeps the activations for Backward().
  // Returns the predictions, [rows x out].
  const std::vector<double>& Forward(const double* x, int64_t rows);

  // Sum over the rows of the squared error of the last Forward() against `y` ([rows x out]).
  double SquaredErrorSum(const double* y) const;

  // Gradients of sum((pred - y)^2) * `scale` for the last Forward(), last layer first. Calls
  // `on_layer(i)` as soon as layer i's gradients are final; they are not touched again.
  void Backward(const double* y, double scale, const std::function<void(int)>& on_layer);

  // weight -= lr * grad_weight, bias -= lr * grad_bias, for every layer.
  void SgdStep(double lr);

  // Every weight then bias, layer by layer, as one vector.
  std::vector<double> Flatten() const;

  std::vector<Linear>& layers() { return layers_; }
  int input_width() const { return layers_.front().in; }
  int output_width() const { return layers_.back().out; }

 private:
  std::vector<Linear> layers_;
  // activations_[i] is layer i's input, activations_.back() the output; each [rows x width].
  std::vector<std::vector<double>> activations_;
  int64_t rows_ = 0;
};

}  // namespace demo
