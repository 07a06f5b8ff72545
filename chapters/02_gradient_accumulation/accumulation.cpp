// accumulation.cpp: the two ways to accumulate gradients and the classic mistakes.
#include "chapters/02_gradient_accumulation/accumulation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/check.hpp"
#include "common/cuda_runtime.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/fill.hpp"

namespace bigbatch::accumulation {
namespace {

/// Calls visit(begin, end) for the micro-batches [0, m), [m, 2m), ... of `rows` rows.
template <class Visit>
void for_each_micro_batch(std::int64_t rows, std::int64_t micro_batch, Visit&& visit) {
  BIGBATCH_CHECK(rows > 0 && micro_batch > 0, "micro-batches: need rows > 0 and micro_batch > 0, got ",
                 rows, " and ", micro_batch);
  for (std::int64_t begin = 0; begin < rows; begin += micro_batch) {
    visit(begin, std::min(rows, begin + micro_batch));
  }
}

/// Adds (+=) into the model's gradients the gradient of the MEAN loss of rows
/// [begin, end) alone (global count = end - begin): what a plain training loop computes
/// for one micro-batch. Returns that mean loss.
float add_micro_batch_mean_gradient(nn::Model& model, const Tensor& x, const Tensor& labels,
                                    std::int64_t begin, std::int64_t end,
                                    const nn::ForwardContext& context) {
  nn::ForwardContext micro_context = context;
  micro_context.first_row = context.first_row + begin;
  const std::int64_t rows = end - begin;
  return nn::accumulate_gradients(model, x.rows(begin, end), labels.rows(begin, end), rows,
                                  micro_context, rows);
}

}  // namespace

std::int64_t micro_batch_count(std::int64_t rows, std::int64_t micro_batch) {
  std::int64_t count = 0;
  for_each_micro_batch(rows, micro_batch, [&](std::int64_t, std::int64_t) { ++count; });
  return count;
}

std::vector<Tensor> copy_gradients(const nn::Model& model) {
  std::vector<Tensor> copies;
  for (const nn::NamedParameter& p : model.parameters()) copies.push_back(p.grad.clone());
  return copies;
}

float memory_free_gradients(nn::Model& model, const Tensor& x, const Tensor& labels,
                            std::int64_t micro_batch, const nn::ForwardContext& context) {
  model.zero_grad();
  return nn::accumulate_gradients(model, x, labels, micro_batch, context);
}

NaiveAccumulator::NaiveAccumulator(const nn::Model& model) {
  for (const nn::NamedParameter& p : model.parameters()) {
    buffers_.emplace_back(p.grad.shape(), DType::f32, model.device(), MemoryCategory::gradients);
  }
}

// snippet: naive
float NaiveAccumulator::gradients(nn::Model& model, const Tensor& x, const Tensor& labels,
                                  std::int64_t micro_batch, const nn::ForwardContext& context) {
  const auto parameters = model.parameters();
  BIGBATCH_CHECK(parameters.size() == buffers_.size(),
                 "NaiveAccumulator: built for a model with ", buffers_.size(),
                 " parameters, given one with ", parameters.size());
  for (const Tensor& buffer : buffers_) fill(buffer, 0.0);
  double loss_sum = 0;
  const std::int64_t count = micro_batch_count(x.dim(0), micro_batch);
  for_each_micro_batch(x.dim(0), micro_batch, [&](std::int64_t begin, std::int64_t end) {
    model.zero_grad();
    loss_sum += add_micro_batch_mean_gradient(model, x, labels, begin, end, context);
    for (std::size_t k = 0; k < buffers_.size(); ++k) axpy(1.0f, parameters[k].grad, buffers_[k]);
  });
  // buffer /= N, then gradients = buffer (cast f32 -> f32 is an exact copy).
  const float inverse_count = 1.0f / static_cast<float>(count);
  for (std::size_t k = 0; k < buffers_.size(); ++k) {
    scale(buffers_[k], inverse_count);
    cast(buffers_[k], parameters[k].grad);
  }
  return static_cast<float>(loss_sum / static_cast<double>(count));
}
// snippet end: naive

std::size_t NaiveAccumulator::buffer_bytes() const {
  std::size_t bytes = 0;
  for (const Tensor& buffer : buffers_) bytes += buffer.nbytes();
  return bytes;
}

float forgotten_zero_grad(nn::Model& model, const Tensor& x, const Tensor& labels,
                          std::int64_t micro_batch, const nn::ForwardContext& context) {
  return nn::accumulate_gradients(model, x, labels, micro_batch, context);
}

float sum_of_micro_batch_means(nn::Model& model, const Tensor& x, const Tensor& labels,
                               std::int64_t micro_batch, const nn::ForwardContext& context) {
  model.zero_grad();
  double loss_sum = 0;
  for_each_micro_batch(x.dim(0), micro_batch, [&](std::int64_t begin, std::int64_t end) {
    loss_sum += add_micro_batch_mean_gradient(model, x, labels, begin, end, context);
  });
  return static_cast<float>(loss_sum);
}

void step_every_micro_batch(nn::Model& model, nn::Optimizer& optimizer, const Tensor& x,
                            const Tensor& labels, std::int64_t micro_batch,
                            const nn::ForwardContext& context) {
  for_each_micro_batch(x.dim(0), micro_batch, [&](std::int64_t begin, std::int64_t end) {
    model.zero_grad();
    add_micro_batch_mean_gradient(model, x, labels, begin, end, context);
    optimizer.step();
  });
}

std::vector<std::vector<double>> per_sample_magnitude(nn::Model& model, const Tensor& x,
                                                      const Tensor& labels,
                                                      std::int64_t global_count,
                                                      const nn::ForwardContext& context) {
  std::vector<std::vector<double>> magnitude;
  for (const nn::NamedParameter& p : model.parameters()) {
    magnitude.emplace_back(static_cast<std::size_t>(p.grad.numel()), 0.0);
  }
  for (std::int64_t row = 0; row < x.dim(0); ++row) {
    nn::ForwardContext sample_context = context;
    sample_context.first_row = context.first_row + row;
    model.zero_grad();
    nn::accumulate_gradients(model, x.rows(row, row + 1), labels.rows(row, row + 1), 1,
                             sample_context, global_count);
    const auto parameters = model.parameters();
    for (std::size_t k = 0; k < parameters.size(); ++k) {
      const Tensor grad = parameters[k].grad.to(Device::cpu());
      const auto values = grad.to_vector<float>();
      for (std::size_t e = 0; e < values.size(); ++e) magnitude[k][e] += std::abs(values[e]);
    }
  }
  return magnitude;
}

StepCost measure(Device device, const std::function<void()>& step) {
  TrackingAllocator& allocator = allocator_for(device);
  allocator.reset_peak();
  const auto start = std::chrono::steady_clock::now();
  step();
  if (device.is_cuda()) cuda_rt::synchronize();  // the step's kernels may still be running
  const auto stop = std::chrono::steady_clock::now();
  const MemoryStats stats = allocator.stats();
  StepCost cost;
  cost.peak = stats.peak;
  cost.peak_total = stats.peak_total;
  cost.seconds = std::chrono::duration<double>(stop - start).count();
  return cost;
}

}  // namespace bigbatch::accumulation
