// gradient_clipping.cpp: clipping by the global norm, and the mistake of clipping each
// micro-batch.
#include "chapters/04_dynamic_loss_scaling/gradient_clipping.hpp"

#include <algorithm>
#include <cmath>

#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "common/check.hpp"
#include "kernels/elementwise.hpp"

namespace bigbatch::clipping {

float clip_factor(float norm, float max_norm) {
  BIGBATCH_CHECK(max_norm > 0.0f, "clip_factor: max_norm must be positive, got ", max_norm);
  // PyTorch: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1, in float.
  return std::min(1.0f, max_norm / (norm + 1e-6f));
}

float clip_gradients(const nn::Network& model, float norm, float max_norm) {
  return clip_gradients(loss_scaling::gradient_tensors(model), norm, max_norm);
}

float clip_gradients(const std::vector<Tensor>& gradients, float norm, float max_norm) {
  const float factor = clip_factor(norm, max_norm);
  if (factor < 1.0f) {
    for (const Tensor& g : gradients) scale(g, factor);
  }
  return factor;
}

float accumulate_clipping_each_micro_batch(nn::Network& model, const Tensor& x,
                                           const Tensor& labels, std::int64_t micro_batch,
                                           const nn::ForwardContext& context,
                                           std::int64_t global_count, float max_norm) {
  const nn::BatchRows views = [&](std::int64_t begin, std::int64_t end) {
    return std::pair{x.rows(begin, end), labels.rows(begin, end)};
  };
  return accumulate_clipping_each_micro_batch(model, x.shape()[0], views, micro_batch, context,
                                              global_count, max_norm);
}

float accumulate_clipping_each_micro_batch(nn::Network& model, std::int64_t rows,
                                           const nn::BatchRows& rows_of,
                                           std::int64_t micro_batch,
                                           const nn::ForwardContext& context,
                                           std::int64_t global_count, float max_norm) {
  BIGBATCH_CHECK(micro_batch > 0, "accumulate_clipping_each_micro_batch: micro_batch must be "
                                  "positive, got ", micro_batch);
  loss_scaling::UnscalePass check;
  float loss = 0;
  for (std::int64_t begin = 0; begin < rows; begin += micro_batch) {
    const std::int64_t end = std::min(rows, begin + micro_batch);
    nn::ForwardContext part = context;
    part.first_row = context.first_row + begin;
    const auto [x_micro, labels_micro] = rows_of(begin, end);
    loss += nn::accumulate_gradients(model, x_micro, labels_micro, end - begin, part,
                                     global_count > 0 ? global_count : rows);
    // The mistake: the running sum's norm, clipped micro-batch by micro-batch.
    clip_gradients(model, check.unscale_and_measure(model, 1.0f).norm, max_norm);
  }
  return loss;
}

Gradients gradients_of(const nn::Network& model) {
  Gradients g;
  for (const nn::NamedParameter& p : model.parameters()) {
    const std::vector<float> values = p.grad.to_vector<float>();
    g.emplace_back(values.begin(), values.end());
  }
  return g;
}

double norm_of(const Gradients& g) {
  double sum = 0;
  for (const std::vector<double>& t : g) {
    for (const double v : t) sum += v * v;
  }
  return std::sqrt(sum);
}

namespace {

void add_into(Gradients& sum, const Gradients& c) {
  if (sum.empty()) {
    sum = c;
    return;
  }
  for (std::size_t p = 0; p < c.size(); ++p) {
    for (std::size_t i = 0; i < c[p].size(); ++i) sum[p][i] += c[p][i];
  }
}

void clip_in_float64(Gradients& g, double max_norm) {
  const double factor = std::min(1.0, max_norm / (norm_of(g) + 1e-6));
  for (std::vector<double>& t : g) {
    for (double& v : t) v *= factor;
  }
}

}  // namespace

Gradients predict_clipping_each_micro_batch(const std::vector<Gradients>& contributions,
                                            double max_norm) {
  Gradients running;
  for (const Gradients& c : contributions) {
    add_into(running, c);
    clip_in_float64(running, max_norm);
  }
  return running;
}

Gradients predict_clipping_the_step(const std::vector<Gradients>& contributions,
                                    double max_norm) {
  Gradients sum;
  for (const Gradients& c : contributions) add_into(sum, c);
  clip_in_float64(sum, max_norm);
  return sum;
}

namespace {

/// Calls f(a_i, b_i) for every element pair of two gradients of the same shapes.
template <class F>
void for_each_pair(const char* op, const Gradients& a, const Gradients& b, const F& f) {
  BIGBATCH_CHECK(a.size() == b.size(), op, ": ", a.size(), " and ", b.size(), " tensors");
  for (std::size_t p = 0; p < a.size(); ++p) {
    BIGBATCH_CHECK(a[p].size() == b[p].size(), op, ": tensor ", p, " has ", a[p].size(),
                   " and ", b[p].size(), " elements");
    for (std::size_t i = 0; i < a[p].size(); ++i) f(a[p][i], b[p][i]);
  }
}

}  // namespace

double largest_difference(const Gradients& a, const Gradients& b) {
  double largest = 0;
  for_each_pair("largest_difference", a, b,
                [&](double x, double y) { largest = std::max(largest, std::fabs(x - y)); });
  return largest;
}

double distance(const Gradients& a, const Gradients& b) {
  double sum = 0;
  for_each_pair("distance", a, b, [&](double x, double y) { sum += (x - y) * (x - y); });
  return std::sqrt(sum);
}

}  // namespace bigbatch::clipping
