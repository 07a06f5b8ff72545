// training.cpp: gradient accumulation over micro-batches and the optimizer wrapper.
#include "nn/training.hpp"

#include <algorithm>
#include <optional>

#include "kernels/cross_entropy.hpp"
#include "kernels/fill.hpp"

namespace bigbatch::nn {
namespace {

/// Network::set_gradients_ready for one scope: the model tells nobody after it, even when
/// the backward throws.
class TellingFinalGradients {
 public:
  TellingFinalGradients(Network& model, const GradientsReady& ready) : model_(model) {
    model_.set_gradients_ready(ready);
  }
  ~TellingFinalGradients() { model_.set_gradients_ready({}); }
  TellingFinalGradients(const TellingFinalGradients&) = delete;
  TellingFinalGradients& operator=(const TellingFinalGradients&) = delete;

 private:
  Network& model_;
};

}  // namespace

Tensor targets_of(const Tensor& labels) {
  return labels.rank() == 2 ? labels.reshaped({labels.numel()}) : labels;
}

namespace {

/// Token targets ([B, T] labels) need the step's count of targets from the caller: the
/// micro-batches alone do not tell it before the first backward.
void require_count_known(std::int64_t global_count, const Tensor& labels_micro) {
  BIGBATCH_CHECK(global_count > 0 || labels_micro.rank() == 1,
                 "accumulate_gradients: token targets ", labels_micro.describe(),
                 " need the step's count of targets (global_count), which the batch's "
                 "micro-batches alone do not tell before the first backward");
}

}  // namespace

float accumulate_gradients(Network& model, std::int64_t rows, const BatchRows& rows_of,
                           std::int64_t micro_batch, const ForwardContext& context,
                           std::int64_t global_count, float loss_scale,
                           const GradientsReady& on_final, TellGradients tell) {
  BIGBATCH_CHECK(rows > 0, "accumulate_gradients: the batch must have rows, got ", rows);
  BIGBATCH_CHECK(micro_batch > 0, "accumulate_gradients: micro_batch must be positive, got ",
                 micro_batch);
  BIGBATCH_CHECK(!on_final || model.releases_state(),
                 "accumulate_gradients: this model does not tell its gradients group by group "
                 "(Network::releases_state), so nobody can be told during its backward");
  // snippet: accumulate
  const float count = static_cast<float>(global_count > 0 ? global_count : rows);
  // The loss of every micro-batch adds into one float: loss += its share of the mean.
  const Tensor loss = Tensor::zeros({1}, DType::f32, model.device(), MemoryCategory::workspace);
  for (std::int64_t begin = 0; begin < rows; begin += micro_batch) {
    const std::int64_t end = std::min(rows, begin + micro_batch);
    const auto [x_micro, labels_micro] = rows_of(begin, end);
    require_count_known(global_count, labels_micro);
    ForwardContext micro_context = context;
    micro_context.first_row = context.first_row + begin;  // dropout follows the sample
    const Tensor logits = model.forward(x_micro, micro_context);
    const Tensor targets = targets_of(labels_micro);
    cross_entropy_forward(logits, targets, loss, count);  // loss += sum / B
    const Tensor dlogits(logits.shape(), DType::f32, model.device(), MemoryCategory::workspace);
    cross_entropy_backward(logits, targets, dlogits, count, loss_scale);  // (p - y) S / B
    std::optional<TellingFinalGradients> told;  // by default the last backward only
    if (on_final && (end == rows || tell == TellGradients::every_micro_batch)) {
      told.emplace(model, on_final);
    }
    model.backward(dlogits);  // gradients +=
  }
  model.complete_gradients();
  // snippet end: accumulate
  return loss.to_vector<float>()[0];
}

float accumulate_gradients(Network& model, const Tensor& x, const Tensor& labels,
                           std::int64_t micro_batch, const ForwardContext& context,
                           std::int64_t global_count, float loss_scale) {
  const std::int64_t rows = x.rank() == 2 ? x.dim(0) : -1;
  const bool labels_fit = labels.dtype() == DType::i32 && labels.rank() >= 1 &&
                          labels.dim(0) == rows &&
                          (labels.rank() == 1 || labels.shape() == x.shape());
  BIGBATCH_CHECK(rows > 0 && labels_fit,
                 "accumulate_gradients: x must be [B, D] with B > 0 and labels i32 [B] (or "
                 "[B, T] for tokens [B, T]), got ", x.describe(), " and ", labels.describe());
  // snippet: token-count
  if (global_count <= 0 && labels.rank() == 1) global_count = rows;  // a label per row
  if (global_count <= 0) {  // the token batch's own targets, counted on the host
    const std::vector<std::int32_t> values = labels.to_vector<std::int32_t>();
    global_count = std::count_if(values.begin(), values.end(),
                                 [](std::int32_t label) { return label != kIgnoredLabel; });
    BIGBATCH_CHECK(global_count > 0, "accumulate_gradients: every target is ignored");
  }
  // snippet end: token-count
  // The batch is on the device already: each micro-batch is a view of its rows.
  const BatchRows views = [&](std::int64_t begin, std::int64_t end) {
    return std::pair{x.rows(begin, end), labels.rows(begin, end)};
  };
  return accumulate_gradients(model, rows, views, micro_batch, context, global_count,
                              loss_scale);
}

Optimizer::Optimizer(std::vector<NamedParameter> parameters, Options options)
    : options_(options) {
  for (NamedParameter& p : parameters) {
    ParameterState state{std::move(p), {}, {}};
    const Shape& shape = state.parameter.value.shape();
    const Device device = state.parameter.value.device();
    if (const auto* sgd = std::get_if<SgdOptions>(&options_)) {
      // sgd_step overwrites the buffer at step 1 (PyTorch clones the first direction).
      if (sgd->momentum != 0) {
        state.first = Tensor(shape, DType::f32, device, MemoryCategory::optimizer_state);
      }
    } else {
      state.first = Tensor::zeros(shape, DType::f32, device, MemoryCategory::optimizer_state);
      state.second = Tensor::zeros(shape, DType::f32, device, MemoryCategory::optimizer_state);
    }
    states_.push_back(std::move(state));
  }
}

void Optimizer::step() {
  ++steps_;
  for (const ParameterState& s : states_) {
    if (const auto* sgd = std::get_if<SgdOptions>(&options_)) {
      sgd_step(s.parameter.value, s.parameter.grad, s.first, *sgd, steps_, s.parameter.half);
    } else {
      adamw_step(s.parameter.value, s.parameter.grad, s.first, s.second,
                 std::get<AdamWOptions>(options_), steps_, s.parameter.half);
    }
  }
}

void Optimizer::set_steps_taken(std::int64_t steps) {
  BIGBATCH_CHECK(steps >= 0, "Optimizer::set_steps_taken: steps must be >= 0, got ", steps);
  steps_ = steps;
}

double Optimizer::learning_rate() const {
  return std::visit([](const auto& options) { return options.lr; }, options_);
}

void Optimizer::set_learning_rate(double lr) {
  std::visit([lr](auto& options) { options.lr = lr; }, options_);
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> result;
  const bool sgd = std::holds_alternative<SgdOptions>(options_);
  for (const ParameterState& s : states_) {
    if (s.first.defined()) {
      result.emplace_back(s.parameter.name + (sgd ? ".momentum_buffer" : ".exp_avg"), s.first);
    }
    if (s.second.defined()) result.emplace_back(s.parameter.name + ".exp_avg_sq", s.second);
  }
  return result;
}

}  // namespace bigbatch::nn
