#include "mlp.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace demo {

namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

uint64_t Rng::NextU64() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::Uniform(double lo, double hi) {
  // 53 random bits fill a double's mantissa exactly.
  double unit = static_cast<double>(NextU64() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * unit;
}

double Rng::Normal() {
  // Box-Muller; 1 - Uniform keeps the log argument away from zero.
  double u1 = 1.0 - Uniform(0.0, 1.0);
  double u2 = Uniform(0.0, 1.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

Mlp::Mlp(const std::vector<int>& widths, uint64_t seed) {
  if (widths.size() < 2)
    throw std::invalid_argument("an MLP needs at least an input and an output");
  Rng rng(seed);
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    Linear layer;
    layer.in = widths[i];
    layer.out = widths[i + 1];
    double bound = 1.0 / std::sqrt(static_cast<double>(layer.in));
    layer.weight.resize(static_cast<size_t>(layer.in) * layer.out);
    for (double& w : layer.weight) w = rng.Uniform(-bound, bound);
    layer.bias.resize(layer.out);
    for (double& b : layer.bias) b = rng.Uniform(-bound, bound);
    layer.grad_weight.assign(layer.weight.size(), 0.0);
    layer.grad_bias.assign(layer.bias.size(), 0.0);
    layers_.push_back(std::move(layer));
  }
}

namespace {

// out[r] = act(W * in[r] + b) for each row; tanh on hidden layers, identity on the last.
void LinearForward(const Linear& l, const double* in, int64_t rows, bool apply_tanh, double* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = in + r * l.in;
    for (int j = 0; j < l.out; ++j) {
      const double* w = l.weight.data() + static_cast<size_t>(j) * l.in;
      double acc = l.bias[j];
      for (int k = 0; k < l.in; ++k) acc += w[k] * x[k];
      out[r * l.out + j] = apply_tanh ? std::tanh(acc) : acc;
    }
  }
}

// Rows are accumulated in order so a given shard always sums the same way.
void LinearWeightGrads(Linear& l, const double* in, const double* delta, int64_t rows) {
  std::fill(l.grad_weight.begin(), l.grad_weight.end(), 0.0);
  std::fill(l.grad_bias.begin(), l.grad_bias.end(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = in + r * l.in;
    for (int j = 0; j < l.out; ++j) {
      double d = delta[r * l.out + j];
      double* g = l.grad_weight.data() + static_cast<size_t>(j) * l.in;
      for (int k = 0; k < l.in; ++k) g[k] += d * x[k];
      l.grad_bias[j] += d;
    }
  }
}

// The delta of the layer below: (delta * W) scaled by tanh' = 1 - tanh^2 of that layer's output.
std::vector<double> BackpropDelta(const Linear& l, const double* in,
                                  const std::vector<double>& delta, int64_t rows) {
  std::vector<double> below(static_cast<size_t>(rows) * l.in, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double* b = below.data() + r * l.in;
    for (int j = 0; j < l.out; ++j) {
      double d = delta[r * l.out + j];
      const double* w = l.weight.data() + static_cast<size_t>(j) * l.in;
      for (int k = 0; k < l.in; ++k) b[k] += d * w[k];
    }
    const double* a = in + r * l.in;
    for (int k = 0; k < l.in; ++k) b[k] *= 1.0 - a[k] * a[k];
  }
  return below;
}

}  // namespace

const std::vector<double>& Mlp::Forward(const double* x, int64_t rows) {
  rows_ = rows;
  activations_.assign(layers_.size() + 1, {});
  activations_[0].assign(x, x + rows * input_width());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Linear& l = layers_[i];
    activations_[i + 1].resize(static_cast<size_t>(rows) * l.out);
    bool hidden = i + 1 < layers_.size();
    LinearForward(l, activations_[i].data(), rows, hidden, activations_[i + 1].data());
  }
  return activations_.back();
}

double Mlp::SquaredErrorSum(const double* y) const {
  const std::vector<double>& pred = activations_.back();
  double sum = 0.0;
  for (size_t i = 0; i < pred.size(); ++i) sum += (pred[i] - y[i]) * (pred[i] - y[i]);
  return sum;
}

void Mlp::Backward(const double* y, double scale, const std::function<void(int)>& on_layer) {
  const std::vector<double>& pred = activations_.back();
  std::vector<double> delta(pred.size());
  for (size_t i = 0; i < pred.size(); ++i) delta[i] = 2.0 * scale * (pred[i] - y[i]);
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    const double* in = activations_[i].data();
    LinearWeightGrads(layers_[i], in, delta.data(), rows_);
    on_layer(i);
    if (i > 0) delta = BackpropDelta(layers_[i], in, delta, rows_);
  }
}

void Mlp::SgdStep(double lr) {
  for (Linear& l : layers_) {
    for (size_t i = 0; i < l.weight.size(); ++i) l.weight[i] -= lr * l.grad_weight[i];
    for (size_t i = 0; i < l.bias.size(); ++i) l.bias[i] -= lr * l.grad_bias[i];
  }
}

std::vector<double> Mlp::Flatten() const {
  std::vector<double> flat;
  for (const Linear& l : layers_) {
    flat.insert(flat.end(), l.weight.begin(), l.weight.end());
    flat.insert(flat.end(), l.bias.begin(), l.bias.end());
  }
  return flat;
}

}  // namespace demo
