// model.cpp: the residual MLP's forward and backward on the kernels (see model.hpp).
#include "nn/model.hpp"

#include <algorithm>

#include <cmath>
#include <map>
#include <stdexcept>

#include "common/io/safetensors.hpp"
#include "common/rng.hpp"
#include "kernels/activation.hpp"
#include "kernels/batchnorm.hpp"
#include "kernels/bias.hpp"
#include "kernels/dropout.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/fill.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_epilogue.hpp"
#include "kernels/layernorm.hpp"
#include "nn/layers.hpp"

namespace bigbatch::nn {
namespace {

constexpr float kNormEps = 1e-5f;
constexpr float kBatchNormMomentum = 0.1f;
// The trainable tensors of each part, in state_entries' order (buffers aside): the stem's
// weight and bias; a block's ln, fc1 and fc2, a weight and a bias each; the head's Linear
// and its norm. parameters()[2 + 6 i, 8 + 6 i) is block i's.
constexpr std::size_t kStemParameters = 2;
constexpr std::size_t kBlockParameters = 6;
constexpr std::size_t kHeadParameters = 4;

/// PyTorch's default Linear init, U(-1/sqrt(in), 1/sqrt(in)) for weight and bias, from
/// the counter-based RNG: element k of parameter `stream` is (2u - 1) / sqrt(in).
void init_uniform(Tensor t, std::int64_t fan_in, std::uint64_t seed, std::uint64_t stream) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  std::vector<float> values(static_cast<std::size_t>(t.numel()));
  for (std::size_t k = 0; k < values.size(); ++k) {
    const double u = random_uniform(seed, stream, k);
    values[k] = static_cast<float>((2.0 * u - 1.0) * bound);
  }
  t.copy_from(Tensor::from_vector(values, t.shape()));
}

/// The state_dict of the equivalent PyTorch module, in its order: a module's own
/// parameters and buffers first, then its children (so head.weight before head.ln.*).
std::vector<StateEntry> state_entries(Linear& stem, std::vector<Block>& blocks,
                                      Linear& head, NormLayer& head_ln) {
  std::vector<StateEntry> entries;
  append_linear(entries, "stem.", stem);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::string prefix = "blocks." + std::to_string(i) + ".";
    append_norm(entries, prefix + "ln.", blocks[i].ln);
    append_linear(entries, prefix + "fc1.", blocks[i].fc1);
    append_linear(entries, prefix + "fc2.", blocks[i].fc2);
  }
  append_linear(entries, "head.", head);
  append_norm(entries, "head.ln.", head_ln);
  return entries;
}

void activation_forward(Activation kind, const Tensor& x, const Tensor& y) {
  if (kind == Activation::gelu) {
    gelu_forward(x, y);
  } else {
    relu_forward(x, y);
  }
}

void activation_backward(Activation kind, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (kind == Activation::gelu) {
    gelu_backward(x, dy, dx);
  } else {
    relu_backward(x, dy, dx);
  }
}

DropoutSpec dropout_spec(const ModelConfig& config, const ForwardContext& context,
                         std::size_t block) {
  const DropoutSpec spec{config.dropout, context.dropout_seed, static_cast<std::uint64_t>(block),
                         context.first_row};
  if (context.drawn_dropouts != nullptr) context.drawn_dropouts->push_back(spec);
  return spec;
}

bool dropout_active(const ModelConfig& config, const ForwardContext& context) {
  return context.training && config.dropout > 0.0f;
}

PointwiseActivation pointwise(Activation kind) {
  return kind == Activation::gelu ? PointwiseActivation::gelu : PointwiseActivation::relu;
}

}  // namespace

DType working_dtype(Precision precision) {
  switch (precision) {
    case Precision::fp32: return DType::f32;
    case Precision::fp16: return DType::f16;
    case Precision::bf16: return DType::bf16;
  }
  return DType::f32;
}

std::string norm_name(Norm norm) { return norm == Norm::layer ? "layer" : "batch"; }
std::string activation_name(Activation act) { return act == Activation::gelu ? "gelu" : "relu"; }
std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

DType Model::activation_dtype() const { return working_dtype(config_.precision); }

Tensor Model::activation_tensor(Shape shape) const {
  return Tensor(std::move(shape), activation_dtype(), device_, MemoryCategory::activations);
}

Tensor Model::workspace_tensor(Shape shape) const {
  return Tensor(std::move(shape), activation_dtype(), device_, MemoryCategory::workspace);
}

void Model::refresh_half_copies() { nn::refresh_half_copies(parameters()); }

Model::Model(const ModelConfig& config, Device device) : config_(config), device_(device) {
  BIGBATCH_CHECK(config.inputs > 0 && config.hidden > 0 && config.expansion > 0 &&
                     config.classes > 0 && config.depth >= 0,
                 "Model: inputs, hidden, expansion and classes must be positive and depth "
                 ">= 0, got inputs ", config.inputs, ", hidden ", config.hidden, ", expansion ",
                 config.expansion, ", classes ", config.classes, ", depth ", config.depth);
  BIGBATCH_CHECK(config.dropout >= 0.0f && config.dropout < 1.0f,
                 "Model: dropout must be in [0, 1), got ", config.dropout);
  const std::int64_t hidden = config.hidden, inner = config.expansion * config.hidden;
  const Precision precision = config.precision;
  stem_ = make_linear(config.inputs, hidden, device, precision);
  for (std::int64_t i = 0; i < config.depth; ++i) {
    blocks_.push_back({make_norm(config.norm, hidden, device),
                       make_linear(hidden, inner, device, precision),
                       make_linear(inner, hidden, device, precision)});
  }
  head_ = make_linear(hidden, config.classes, device, precision);
  head_ln_ = make_norm(config.norm, hidden, device);

  // Linear weights and biases are drawn; stream = the index in parameters(). A Linear's
  // bias follows its weight, whose second dimension is the fan-in of both.
  std::uint64_t parameter_index = 0;
  std::int64_t fan_in = 0;
  for (const StateEntry& entry : state_entries(stem_, blocks_, head_, head_ln_)) {
    if (entry.grad == nullptr) continue;  // a buffer
    const bool is_norm = entry.name.find("ln.") != std::string::npos;
    if (!is_norm) {
      if (entry.value->rank() == 2) fan_in = entry.value->dim(1);
      init_uniform(*entry.value, fan_in, config.seed, parameter_index);
    }
    ++parameter_index;
  }
  refresh_half_copies();
}

std::vector<NamedParameter> Model::parameters() const {
  auto& self = const_cast<Model&>(*this);  // the entries point into members; nothing is changed
  return named_parameters(state_entries(self.stem_, self.blocks_, self.head_, self.head_ln_));
}

std::vector<std::pair<std::string, Tensor>> Model::state_dict() const {
  BIGBATCH_CHECK(!masters_released_, "Model: the f32 master weights are released (ZeRO shards ",
                 "them over ranks): gather them into the model first");
  auto& self = const_cast<Model&>(*this);
  return state_tensors(state_entries(self.stem_, self.blocks_, self.head_, self.head_ln_));
}

std::int64_t Model::parameter_count() const {
  return count_parameters(parameters());
}

void Model::zero_grad() { zero_gradients(parameters()); }

void Model::release_gradients(std::size_t first, std::size_t end) {
  const std::vector<StateEntry> entries = state_entries(stem_, blocks_, head_, head_ln_);
  const auto trainable = static_cast<std::size_t>(std::count_if(
      entries.begin(), entries.end(), [](const StateEntry& e) { return e.grad != nullptr; }));
  BIGBATCH_CHECK(first <= end && end <= trainable, "Model::release_gradients: [", first, ", ",
                 end, ") of ", trainable, " parameters");
  std::size_t index = 0;
  for (const StateEntry& entry : entries) {
    if (entry.grad == nullptr) continue;  // a buffer
    if (index >= first && index < end && entry.grad->defined()) {
      *entry.grad = Tensor();
      ++released_gradients_;
    }
    ++index;
  }
}

void Model::release_master_weights() {
  for (const StateEntry& entry : state_entries(stem_, blocks_, head_, head_ln_)) {
    if (entry.half != nullptr && entry.half->defined()) *entry.value = Tensor();
  }
  masters_released_ = is_mixed(config_.precision);
}

void Model::allocate_master_weights() {
  if (!masters_released_) return;
  for (const StateEntry& entry : state_entries(stem_, blocks_, head_, head_ln_)) {
    if (entry.half != nullptr && entry.half->defined()) {
      *entry.value = Tensor(entry.half->shape(), DType::f32, device_,
                            MemoryCategory::master_weights);
    }
  }
  masters_released_ = false;
}

void Model::allocate_released_gradients(std::size_t first, std::size_t end) {
  if (released_gradients_ == 0) return;  // every backward asks; most runs release none
  std::size_t index = 0;
  for (const StateEntry& entry : state_entries(stem_, blocks_, head_, head_ln_)) {
    if (entry.grad == nullptr) continue;
    if (index >= first && index < end && !entry.grad->defined()) {
      // Its shape is its value's, or its working copy's when the master is released.
      const Tensor& like = entry.value->defined() ? *entry.value : *entry.half;
      *entry.grad = Tensor::zeros(like.shape(), DType::f32, device_, MemoryCategory::gradients);
      --released_gradients_;
    }
    ++index;
  }
}

Tensor Model::norm_forward(const NormLayer& layer, const Tensor& x, bool training, Tensor& mean,
                           Tensor& rstd, bool update_running) {
  const std::int64_t rows = x.dim(0), features = x.dim(1);
  // Statistics in f32 whatever the activations' dtype.
  const auto statistics = [&](std::int64_t n) {
    return Tensor({n}, DType::f32, device_, MemoryCategory::activations);
  };
  Tensor y = activation_tensor({rows, features});
  if (config_.norm == Norm::layer) {
    mean = statistics(rows);
    rstd = statistics(rows);
    layernorm_forward(x, layer.weight, layer.bias, y, mean, rstd, kNormEps);
  } else if (training) {
    BIGBATCH_CHECK(rows >= 2, "Model: BatchNorm in training needs at least 2 samples per "
                   "micro-batch, got ", rows);
    mean = statistics(features);
    rstd = statistics(features);
    // A recomputed block must not move the running statistics again: momentum 0 leaves
    // them exact (0 * batch + 1 * running, kernels/batchnorm.hpp's running_average).
    batchnorm_forward_train(x, layer.weight, layer.bias, y, mean, rstd, layer.running_mean,
                            layer.running_var, update_running ? kBatchNormMomentum : 0.0f,
                            kNormEps);
  } else {
    mean = Tensor();  // evaluation uses the running statistics: nothing to save
    rstd = Tensor();
    batchnorm_forward_eval(x, layer.weight, layer.bias, layer.running_mean, layer.running_var,
                           y, kNormEps);
  }
  return y;
}

Tensor Model::norm_backward(const NormLayer& layer, const Tensor& x, const Tensor& mean,
                            const Tensor& rstd, const Tensor& dy) {
  Tensor dx = workspace_tensor(x.shape());
  if (config_.norm == Norm::layer) {
    layernorm_backward(x, layer.weight, mean, rstd, dy, dx, layer.weight_grad, layer.bias_grad);
  } else {
    BIGBATCH_CHECK(mean.defined(), "Model::backward: BatchNorm's backward needs a training "
                   "forward (batch statistics); this forward ran in evaluation mode");
    batchnorm_backward(x, layer.weight, mean, rstd, dy, dx, layer.weight_grad, layer.bias_grad);
  }
  return dx;
}

Tensor Model::block_forward(std::size_t index, const Tensor& h, const ForwardContext& context,
                            BlockActivations& saved, BlockKeep keep) {
  BIGBATCH_CHECK(keep != BlockKeep::all_but_probabilities, "Model::block_forward: the MLP's "
                 "block has no attention probabilities to recompute");
  const Block& block = blocks_.at(index);
  const std::int64_t rows = h.dim(0), inner = config_.expansion * config_.hidden;
  saved.input = h;
  saved.normed = norm_forward(block.ln, h, context.training, saved.mean, saved.rstd,
                              /*update_running=*/!context.recompute);
  saved.pre_activation = activation_tensor({rows, inner});
  saved.hidden = activation_tensor({rows, inner});
  if (config_.activation == Activation::gelu) {  // one cuBLASLt call where fused epilogues are on
    linear_bias_gelu_forward(saved.normed, working_weight(block.fc1), block.fc1.bias,
                             saved.pre_activation, saved.hidden);
  } else {
    linear_forward(block.fc1, saved.normed, saved.pre_activation);
    activation_forward(config_.activation, saved.pre_activation, saved.hidden);
  }
  if (dropout_active(config_, context)) {
    dropout_forward(saved.hidden, saved.hidden, dropout_spec(config_, context, index));
  }
  // output = h + fc2(...): PyTorch's order, the branch first, then one float addition.
  Tensor output = activation_tensor({rows, config_.hidden});
  linear_forward(block.fc2, saved.hidden, output);
  axpy(1.0f, h, output);
  if (keep == BlockKeep::gemm_outputs) {  // block_backward recomputes them
    saved.normed = Tensor();
    saved.hidden = Tensor();
  }
  return output;
}

Tensor Model::block_backward(std::size_t index, const BlockActivations& saved,
                             const Tensor& d_output, const ForwardContext& context) {
  const Block& block = blocks_.at(index);
  allocate_released_gradients(kStemParameters + kBlockParameters * index,
                              kStemParameters + kBlockParameters * (index + 1));
  // d_hidden: [b, E*H], the gradient of fc2's input, then (in place) of fc1's output.
  Tensor d_hidden = workspace_tensor(saved.pre_activation.shape());
  Tensor hidden = saved.hidden;
  const bool recompute_hidden = !hidden.defined();
  if (config_.activation == Activation::gelu && !dropout_active(config_, context) &&
      !recompute_hidden) {
    // GELU alone: fc2's input-gradient GEMM and GELU's backward as one call (one cuBLASLt
    // call where fused epilogues are on; otherwise the same bits as the pass below with
    // p = 0, kernels/dropout.hpp).
    gemm_gelu_backward(d_output, working_weight(block.fc2), saved.pre_activation, d_hidden);
  } else {
    linear_backward_input(block.fc2, d_output, d_hidden);
    // One pass through dropout's and the activation's backward (no dropout: p = 0, the
    // same bits). Under selective recomputation (BlockKeep::gemm_outputs) the same pass
    // rebuilds the activation after dropout, fc2's input, from fc1's output and the mask
    // (the counter RNG draws it again): the forward's bits (kernels/dropout.hpp).
    if (recompute_hidden) hidden = activation_tensor(saved.pre_activation.shape());
    const DropoutSpec spec = dropout_active(config_, context)
                                 ? dropout_spec(config_, context, index)
                                 : DropoutSpec{0.0f, 0, 0, context.first_row};
    activation_dropout_backward(pointwise(config_.activation), saved.pre_activation, d_hidden,
                                d_hidden, spec, recompute_hidden ? hidden : Tensor());
  }
  linear_backward_parameters(block.fc2, hidden, d_output);
  hidden = Tensor();
  Tensor normed = saved.normed;
  if (!normed.defined()) {
    Tensor mean, rstd;  // the same statistics again; BatchNorm's running ones stay
    normed = norm_forward(block.ln, saved.input, context.training, mean, rstd,
                          /*update_running=*/false);
  }
  Tensor d_normed = workspace_tensor(normed.shape());
  linear_backward(block.fc1, normed, d_hidden, d_normed);
  normed = Tensor();
  // The residual: d_input = d_output + (the branch's gradient through ln).
  Tensor d_input = norm_backward(block.ln, saved.input, saved.mean, saved.rstd, d_normed);
  gradients_final(kStemParameters + kBlockParameters * index,
                  kStemParameters + kBlockParameters * (index + 1));
  axpy(1.0f, d_output, d_input);
  return d_input;
}

void Model::check_data(const Dataset& data) const {
  BIGBATCH_CHECK(!data.holds_tokens() && data.features.dtype() == DType::f32 &&
                     data.features.rank() == 2,
                 "the residual MLP trains on rows of f32 features with a label each; the data "
                 "set '", data.name, "' holds ", data.features.describe(), " and labels ",
                 data.labels.describe());
  BIGBATCH_CHECK(data.feature_dim() == config_.inputs, "the data set '", data.name, "' has ",
                 data.feature_dim(), " features per sample, the model takes ", config_.inputs);
  BIGBATCH_CHECK(data.num_classes <= config_.classes, "the data set '", data.name, "' has ",
                 data.num_classes, " classes, the model's head has ", config_.classes);
}

Tensor Model::forward(const Tensor& x, const ForwardContext& context) {
  BIGBATCH_CHECK(x.dtype() == DType::f32 && x.rank() == 2 && x.dim(1) == config_.inputs,
                 "Model::forward: x must be f32 [b, ", config_.inputs, "], got ", x.describe());
  BIGBATCH_CHECK(x.device() == device_, "Model::forward: x is on ", x.device().name(),
                 ", the model on ", device_.name());
  saved_ = SavedActivations{};
  saved_.context = context;
  const std::int64_t rows = x.dim(0);
  if (activation_dtype() == DType::f32) {
    saved_.input = x;
  } else {
    saved_.input = activation_tensor({rows, config_.inputs});  // the stem reads x in 16 bits
    cast(x, saved_.input);
  }
  saved_.stem_pre_activation = activation_tensor({rows, config_.hidden});
  linear_forward(stem_, saved_.input, saved_.stem_pre_activation);
  Tensor h = activation_tensor({rows, config_.hidden});
  activation_forward(config_.activation, saved_.stem_pre_activation, h);

  if (!context.training) {
    // Inference: no backward pass follows, so each block's saved tensors go as soon as the
    // block is done (an evaluation holds one block's activations, not the whole model's).
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      BlockActivations transient;
      h = block_forward(i, h, context, transient);
    }
  } else if (runner_) {
    h = runner_->forward(*this, std::move(h), context);  // saved_.blocks stays empty
  } else {
    saved_.blocks.resize(blocks_.size());
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      h = block_forward(i, h, context, saved_.blocks[i]);
    }
  }

  saved_.head_input = h;
  saved_.head_normed =
      norm_forward(head_ln_, h, context.training, saved_.head_mean, saved_.head_rstd);
  // Logits in f32 in either precision: the loss and softmax run in f32.
  Tensor logits({rows, config_.classes}, DType::f32, device_, MemoryCategory::activations);
  linear_forward(head_, saved_.head_normed, logits);
  return logits;
}

void Model::backward(const Tensor& dlogits) {
  BIGBATCH_CHECK(has_saved_activations(), "Model::backward: no saved activations (call "
                 "forward first; each forward allows one backward)");
  const std::int64_t rows = saved_.input.dim(0);
  BIGBATCH_CHECK(dlogits.dtype() == DType::f32 && (dlogits.shape() == Shape{rows, config_.classes}),
                 "Model::backward: dlogits must be f32 [", rows, ", ", config_.classes,
                 "], got ", dlogits.describe());
  SavedActivations saved = std::move(saved_);
  saved_ = SavedActivations{};
  const std::size_t head_first = kStemParameters + kBlockParameters * blocks_.size();
  allocate_released_gradients(head_first, head_first + kHeadParameters);

  // Under mixed precision the head's backward multiplies 16-bit operands: dlogits is rounded
  // here, the one place where a gradient (times the loss scale) enters 16 bits.
  Tensor d_head = dlogits;
  if (activation_dtype() != DType::f32) {
    d_head = workspace_tensor(dlogits.shape());
    cast(dlogits, d_head);
  }
  Tensor dh;
  {
    const Tensor d_normed = workspace_tensor({rows, config_.hidden});
    linear_backward(head_, saved.head_normed, d_head, d_normed);
    d_head = Tensor();
    dh = norm_backward(head_ln_, saved.head_input, saved.head_mean, saved.head_rstd, d_normed);
  }  // d_normed is freed here, before the blocks' backward
  gradients_final(head_first, head_first + kHeadParameters);
  saved.head_input = saved.head_normed = saved.head_mean = saved.head_rstd = Tensor();

  if (runner_) {
    dh = runner_->backward(*this, std::move(dh), saved.context);
  } else {
    for (std::size_t i = blocks_.size(); i-- > 0;) {
      dh = block_backward(i, saved.blocks[i], dh, saved.context);
      saved.blocks[i] = BlockActivations{};  // this block's activations are no longer needed
    }
  }

  allocate_released_gradients(0, kStemParameters);
  activation_backward(config_.activation, saved.stem_pre_activation, dh, dh);
  linear_backward(stem_, saved.input, dh, Tensor());
  gradients_final(0, kStemParameters);
}

void Model::save(const std::string& path, const std::map<std::string, Tensor>& masters) const {
  const std::map<std::string, std::string> metadata = {
      {"format", "bigbatch residual MLP"},
      {"inputs", std::to_string(config_.inputs)},
      {"hidden", std::to_string(config_.hidden)},
      {"expansion", std::to_string(config_.expansion)},
      {"classes", std::to_string(config_.classes)},
      {"depth", std::to_string(config_.depth)},
      {"norm", norm_name(config_.norm)},
      {"activation", activation_name(config_.activation)},
  };
  if (!masters_released_) {
    save_safetensors(path, state_dict(), metadata);
    return;
  }
  auto& self = const_cast<Model&>(*this);  // the entries point into members; nothing is changed
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const StateEntry& entry : state_entries(self.stem_, self.blocks_, self.head_, self.head_ln_)) {
    if (entry.value->defined()) {
      tensors.emplace_back(entry.name, *entry.value);
      continue;
    }
    const auto master = masters.find(entry.name);
    BIGBATCH_CHECK(master != masters.end() && master->second.same_shape(*entry.half),
                   "Model::save: the f32 master of ", entry.name, " is released and not given "
                   "whole (gather the ranks' shards first)");
    tensors.emplace_back(entry.name, master->second);
  }
  save_safetensors(path, tensors, metadata);
}

void Model::load(const std::string& path) { load_state_dict(load_safetensors(path), path); }

void Model::load_state_dict(const std::map<std::string, Tensor>& loaded, const std::string& source) {
  load_state(state_dict(), loaded, source);
  refresh_half_copies();
}

}  // namespace bigbatch::nn
