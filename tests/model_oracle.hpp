// model_oracle.hpp: the residual MLP of nn/ in float64, in plain loops (forward and
// backward, with the dropout mask the kernel draws), on parameters given by name. Shared by
// test_model.cpp (one step's gradients, checked by finite differences there) and
// test_model_float64_runs.cpp (whole training runs in float64).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/model.hpp"
#include "common/rng.hpp"
#include "kernels/dropout.hpp"

namespace bigbatch::testing {

/// Per-parameter values or gradients in double, by parameter name.
using Gradients = std::map<std::string, std::vector<double>>;

using nn::Activation;
using nn::ForwardContext;
using nn::ModelConfig;

// ---- the float64 oracle: the whole model in plain loops ----------------------------

struct OracleBatch {
  std::vector<double> x;  // [rows, D]
  std::vector<int> labels;
  std::int64_t rows = 0;
  ForwardContext context;
};

/// The model in double, on parameters given by name (the model's own, widened exactly).
class Oracle {
 public:
  Oracle(ModelConfig config, Gradients parameters)
      : config_(config), p_(std::move(parameters)) {}

  Gradients& parameters() { return p_; }

  /// The mean cross-entropy over the batch; with `gradients`, also its gradient.
  double loss(const OracleBatch& batch, Gradients* gradients = nullptr) const {
    const std::int64_t n = batch.rows, H = config_.hidden, E = config_.expansion * H;
    // Forward, keeping what the backward needs.
    std::vector<double> stem_pre = linear(batch.x, n, "stem.");
    std::vector<double> h = apply(stem_pre, &Oracle::act);
    struct Saved {
      std::vector<double> input, xhat, rstd, normed, pre, hidden, mask;
    };
    std::vector<Saved> saved(static_cast<std::size_t>(config_.depth));
    for (std::int64_t b = 0; b < config_.depth; ++b) {
      Saved& s = saved[static_cast<std::size_t>(b)];
      const std::string prefix = "blocks." + std::to_string(b) + ".";
      s.input = h;
      s.normed = layernorm(h, n, prefix + "ln.", s.xhat, s.rstd);
      s.pre = linear(s.normed, n, prefix + "fc1.");
      s.mask = dropout_mask(batch, b, n, E);
      s.hidden = apply(s.pre, &Oracle::act);
      for (std::size_t k = 0; k < s.hidden.size(); ++k) s.hidden[k] *= s.mask[k];
      const std::vector<double> branch = linear(s.hidden, n, prefix + "fc2.");
      for (std::size_t k = 0; k < h.size(); ++k) h[k] += branch[k];
    }
    std::vector<double> head_xhat, head_rstd;
    const std::vector<double> head_normed = layernorm(h, n, "head.ln.", head_xhat, head_rstd);
    const std::vector<double> logits = linear(head_normed, n, "head.");

    // Cross-entropy, mean over the batch, and its gradient.
    const std::int64_t C = config_.classes;
    double total = 0;
    std::vector<double> dlogits(logits.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const double* z = &logits[static_cast<std::size_t>(i * C)];
      const double m = *std::max_element(z, z + C);
      double sum = 0;
      for (std::int64_t c = 0; c < C; ++c) sum += std::exp(z[c] - m);
      total += m + std::log(sum) - z[batch.labels[static_cast<std::size_t>(i)]];
      for (std::int64_t c = 0; c < C; ++c) {
        const double one_hot = c == batch.labels[static_cast<std::size_t>(i)] ? 1 : 0;
        dlogits[static_cast<std::size_t>(i * C + c)] = (std::exp(z[c] - m) / sum - one_hot) / n;
      }
    }
    if (gradients == nullptr) return total / n;

    // Backward.
    Gradients& g = *gradients;
    for (const auto& [name, values] : p_) g[name].assign(values.size(), 0.0);
    std::vector<double> dh = layernorm_backward(
        linear_backward(head_normed, dlogits, n, "head.", g), head_xhat, head_rstd, n, "head.ln.", g);
    for (std::int64_t b = config_.depth - 1; b >= 0; --b) {
      const Saved& s = saved[static_cast<std::size_t>(b)];
      const std::string prefix = "blocks." + std::to_string(b) + ".";
      std::vector<double> d_hidden = linear_backward(s.hidden, dh, n, prefix + "fc2.", g);
      for (std::size_t k = 0; k < d_hidden.size(); ++k) {
        d_hidden[k] *= s.mask[k] * act_derivative(s.pre[k]);
      }
      const std::vector<double> d_input = layernorm_backward(
          linear_backward(s.normed, d_hidden, n, prefix + "fc1.", g), s.xhat, s.rstd, n,
          prefix + "ln.", g);
      for (std::size_t k = 0; k < dh.size(); ++k) dh[k] += d_input[k];
    }
    for (std::size_t k = 0; k < dh.size(); ++k) dh[k] *= act_derivative(stem_pre[k]);
    linear_backward(batch.x, dh, n, "stem.", g);
    (void)H;
    return total / n;
  }

 private:
  const std::vector<double>& p(const std::string& name) const { return p_.at(name); }

  double act(double x) const {
    if (config_.activation == Activation::relu) return x > 0 ? x : 0;
    const double k = std::sqrt(2 / M_PI);
    return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
  }
  double act_derivative(double x) const {
    if (config_.activation == Activation::relu) return x > 0 ? 1 : 0;
    const double k = std::sqrt(2 / M_PI);
    const double t = std::tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
  }
  std::vector<double> apply(std::vector<double> v, double (Oracle::*f)(double) const) const {
    for (double& e : v) e = (this->*f)(e);
    return v;
  }

  // y = x W^T + b   x: [n, in], W: [out, in]
  std::vector<double> linear(const std::vector<double>& x, std::int64_t n,
                             const std::string& prefix) const {
    const auto& w = p(prefix + "weight");
    const auto& bias = p(prefix + "bias");
    const std::int64_t out = static_cast<std::int64_t>(bias.size());
    const std::int64_t in = static_cast<std::int64_t>(w.size()) / out;
    std::vector<double> y(static_cast<std::size_t>(n * out));
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t o = 0; o < out; ++o) {
        double sum = bias[static_cast<std::size_t>(o)];
        for (std::int64_t k = 0; k < in; ++k) {
          sum += x[static_cast<std::size_t>(i * in + k)] * w[static_cast<std::size_t>(o * in + k)];
        }
        y[static_cast<std::size_t>(i * out + o)] = sum;
      }
    }
    return y;
  }
  // Adds dW, db into g; returns dx = dy W.
  std::vector<double> linear_backward(const std::vector<double>& x, const std::vector<double>& dy,
                                      std::int64_t n, const std::string& prefix,
                                      Gradients& g) const {
    const auto& w = p(prefix + "weight");
    const std::int64_t out = static_cast<std::int64_t>(p(prefix + "bias").size());
    const std::int64_t in = static_cast<std::int64_t>(w.size()) / out;
    auto& dw = g[prefix + "weight"];
    auto& db = g[prefix + "bias"];
    std::vector<double> dx(static_cast<std::size_t>(n * in), 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t o = 0; o < out; ++o) {
        const double d = dy[static_cast<std::size_t>(i * out + o)];
        db[static_cast<std::size_t>(o)] += d;
        for (std::int64_t k = 0; k < in; ++k) {
          dw[static_cast<std::size_t>(o * in + k)] += d * x[static_cast<std::size_t>(i * in + k)];
          dx[static_cast<std::size_t>(i * in + k)] += d * w[static_cast<std::size_t>(o * in + k)];
        }
      }
    }
    return dx;
  }
  std::vector<double> layernorm(const std::vector<double>& x, std::int64_t n,
                                const std::string& prefix, std::vector<double>& xhat,
                                std::vector<double>& rstd) const {
    const auto& w = p(prefix + "weight");
    const auto& b = p(prefix + "bias");
    const std::int64_t H = static_cast<std::int64_t>(w.size());
    std::vector<double> y(x.size());
    xhat.assign(x.size(), 0.0);
    rstd.assign(static_cast<std::size_t>(n), 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
      double mean = 0, var = 0;
      for (std::int64_t j = 0; j < H; ++j) mean += x[static_cast<std::size_t>(i * H + j)];
      mean /= H;
      for (std::int64_t j = 0; j < H; ++j) {
        const double d = x[static_cast<std::size_t>(i * H + j)] - mean;
        var += d * d;
      }
      rstd[static_cast<std::size_t>(i)] = 1 / std::sqrt(var / H + 1e-5);
      for (std::int64_t j = 0; j < H; ++j) {
        const std::size_t k = static_cast<std::size_t>(i * H + j);
        xhat[k] = (x[k] - mean) * rstd[static_cast<std::size_t>(i)];
        y[k] = xhat[k] * w[static_cast<std::size_t>(j)] + b[static_cast<std::size_t>(j)];
      }
    }
    return y;
  }
  // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy w; adds dw, db.
  std::vector<double> layernorm_backward(const std::vector<double>& dy, const std::vector<double>& xhat,
                                         const std::vector<double>& rstd, std::int64_t n,
                                         const std::string& prefix, Gradients& g) const {
    const auto& w = p(prefix + "weight");
    const std::int64_t H = static_cast<std::int64_t>(w.size());
    auto& dw = g[prefix + "weight"];
    auto& db = g[prefix + "bias"];
    std::vector<double> dx(dy.size());
    for (std::int64_t i = 0; i < n; ++i) {
      double mean_d = 0, mean_dx = 0;
      for (std::int64_t j = 0; j < H; ++j) {
        const std::size_t k = static_cast<std::size_t>(i * H + j);
        const double dxhat = dy[k] * w[static_cast<std::size_t>(j)];
        mean_d += dxhat / H;
        mean_dx += dxhat * xhat[k] / H;
        dw[static_cast<std::size_t>(j)] += dy[k] * xhat[k];
        db[static_cast<std::size_t>(j)] += dy[k];
      }
      for (std::int64_t j = 0; j < H; ++j) {
        const std::size_t k = static_cast<std::size_t>(i * H + j);
        const double dxhat = dy[k] * w[static_cast<std::size_t>(j)];
        dx[k] = rstd[static_cast<std::size_t>(i)] * (dxhat - mean_d - xhat[k] * mean_dx);
      }
    }
    return dx;
  }
  // The dropout of block b as the kernel defines it: element (i, j) kept with the float
  // factor 1/(1-p) iff random_uniform(seed, b, (first_row + i) * N + j) >= p.
  std::vector<double> dropout_mask(const OracleBatch& batch, std::int64_t block, std::int64_t n,
                                   std::int64_t width) const {
    std::vector<double> mask(static_cast<std::size_t>(n * width), 1.0);
    if (!batch.context.training || config_.dropout == 0) return mask;
    const double keep = detail::dropout_keep_scale(config_.dropout);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < width; ++j) {
        const auto g = static_cast<std::uint64_t>((batch.context.first_row + i) * width + j);
        const bool kept = random_uniform(batch.context.dropout_seed,
                                         static_cast<std::uint64_t>(block), g) >= config_.dropout;
        mask[static_cast<std::size_t>(i * width + j)] = kept ? keep : 0.0;
      }
    }
    return mask;
  }

  ModelConfig config_;
  Gradients p_;
};

}  // namespace bigbatch::testing
