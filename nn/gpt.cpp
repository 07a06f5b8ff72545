// gpt.cpp: the GPT's forward and backward on the kernels (see gpt.hpp).
#include "nn/gpt.hpp"

#include <cmath>
#include <initializer_list>
#include <numbers>
#include <stdexcept>

#include "common/io/safetensors.hpp"
#include "common/rng.hpp"
#include "kernels/activation.hpp"
#include "kernels/attention.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/dropout.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/embedding.hpp"
#include "kernels/fill.hpp"
#include "kernels/gemm.hpp"
#include "kernels/layernorm.hpp"
#include "nn/layers.hpp"

namespace bigbatch::nn {
namespace {

constexpr float kNormEps = 1e-5f;
constexpr double kInitStd = 0.02;  // nanoGPT's std of every weight and table

/// A [rows, C] table of `dtype` (its master when mixed, with a 16-bit working copy).
EmbeddingTable make_table(std::int64_t rows, std::int64_t width, Device device,
                          Precision precision, DType dtype) {
  const bool mixed = is_mixed(precision);
  EmbeddingTable table{
      Tensor({rows, width}, dtype, device,
             mixed ? MemoryCategory::master_weights : MemoryCategory::parameters),
      Tensor::zeros({rows, width}, dtype, device, MemoryCategory::gradients), {}};
  if (mixed) {
    table.weight_half =
        Tensor({rows, width}, working_dtype(precision), device, MemoryCategory::parameters);
  }
  return table;
}

/// Normal(0, std) from the counter-based RNG: element k of parameter `stream` is the
/// Box-Muller transform of uniforms 2k and 2k + 1, sqrt(-2 ln(1 - u)) cos(2 pi v), in double,
/// rounded once to the tensor's dtype.
void init_normal(Tensor t, double std, std::uint64_t seed, std::uint64_t stream) {
  std::vector<double> values(static_cast<std::size_t>(t.numel()));
  for (std::size_t k = 0; k < values.size(); ++k) {
    const double u = random_uniform(seed, stream, 2 * k);
    const double v = random_uniform(seed, stream, 2 * k + 1);
    values[k] = std * std::sqrt(-2.0 * std::log(1.0 - u)) * std::cos(2.0 * std::numbers::pi * v);
  }
  if (t.dtype() == DType::f64) {
    t.copy_from(Tensor::from_vector(values, t.shape()));
  } else {
    const std::vector<float> rounded(values.begin(), values.end());
    t.copy_from(Tensor::from_vector(rounded, t.shape()));
  }
}

/// The DropoutSpec of one dropout site, on tensors whose first dimension is the sequence
/// ([b, T, C] for the residual stream, [b, heads, T, T] for the attention's probabilities),
/// each site its own stream: 0 for the embeddings, then 1 + 3 i, 2 + 3 i and 3 + 3 i for
/// block i's attention probabilities, attention residual and MLP residual.
DropoutSpec site(const GptConfig& config, const ForwardContext& context, std::uint64_t stream) {
  const DropoutSpec spec{config.dropout, context.dropout_seed, stream, context.first_row};
  if (context.drawn_dropouts != nullptr) context.drawn_dropouts->push_back(spec);
  return spec;
}

std::uint64_t attention_stream(std::size_t block) { return 1 + 3 * block; }
std::uint64_t attention_residual_stream(std::size_t block) { return 2 + 3 * block; }
std::uint64_t mlp_residual_stream(std::size_t block) { return 3 + 3 * block; }

/// A [b, T, W] tensor as the [b*T, W] matrix the Linear layers and norms see.
Tensor rows(const Tensor& t) { return t.reshaped({t.dim(0) * t.dim(1), t.dim(2)}); }

bool dropout_active(const GptConfig& config, const ForwardContext& context) {
  return context.training && config.dropout > 0.0f;
}

}  // namespace

GptSavedBytes gpt_saved_bytes(const GptConfig& config, std::int64_t sequences,
                              std::int64_t length) {
  const auto W = static_cast<std::size_t>(dtype_size(working_dtype(config.precision)));
  const auto n = static_cast<std::size_t>(sequences * length);
  const auto C = static_cast<std::size_t>(config.width);
  const auto rows = static_cast<std::size_t>(sequences * config.heads * length);
  constexpr std::size_t f32 = 4;
  const std::size_t attention = config.attention == AttentionKernel::efficient
                                    ? 2 * f32 * rows  // each query row's (m, l)
                                    : W * rows * static_cast<std::size_t>(length);  // P
  GptSavedBytes bytes;
  bytes.embeddings = W * n * C;
  bytes.per_block = 16 * W * n * C + attention + 4 * f32 * n;
  bytes.head = W * n * C + 2 * f32 * n + f32 * n * static_cast<std::size_t>(config.vocabulary);
  return bytes;
}

std::string attention_kernel_name(AttentionKernel kernel) {
  return kernel == AttentionKernel::efficient ? "efficient" : "plain";
}

std::int64_t gpt_parameter_count(const GptConfig& c) {
  const std::int64_t V = c.vocabulary, T = c.context, N = c.layers, C = c.width;
  BIGBATCH_CHECK(V >= 0 && T >= 0 && N >= 0 && C >= 0, "gpt_parameter_count: negative size");
  std::int64_t total = 0;
  bool overflow = false;
  const auto add = [&](std::initializer_list<std::int64_t> factors) {
    std::int64_t product = 1;
    for (const std::int64_t factor : factors) {
      overflow |= __builtin_mul_overflow(product, factor, &product);
    }
    overflow |= __builtin_add_overflow(total, product, &total);
  };
  add({V, C});  // wte
  add({T, C});  // wpe
  // Each block: c_attn [3C, C], attn.c_proj [C, C], mlp.c_fc [4C, C], mlp.c_proj [C, 4C]
  // (12 C^2); their biases (3C + C + 4C + C) and ln_1's and ln_2's weights and biases (4C).
  add({N, 12, C, C});
  add({N, 13, C});
  add({2, C});  // ln_f
  BIGBATCH_CHECK(!overflow, "a GPT of vocabulary ", V, ", context ", T, ", ", N,
                 " layers and width ", C, " has too many parameters to count in 64 bits");
  return total;
}

void check_gpt_config(const GptConfig& config) {
  BIGBATCH_CHECK(config.vocabulary > 0 && config.context > 0 && config.layers >= 0 &&
                     config.width > 0 && config.heads > 0 && config.width % config.heads == 0,
                 "Gpt: vocabulary, context, width and heads must be positive, layers >= 0, and "
                 "heads must divide the width; got vocabulary ",
                 config.vocabulary, ", context ", config.context, ", layers ", config.layers,
                 ", width ", config.width, ", heads ", config.heads);
  BIGBATCH_CHECK(config.dropout >= 0.0f && config.dropout < 1.0f,
                 "Gpt: dropout must be in [0, 1), got ", config.dropout);
  gpt_parameter_count(config);
}

Gpt::Gpt(const GptConfig& config, Device device) : Gpt(config, device, DType::f32) {}

Gpt Gpt::float64(const GptConfig& config) {
  BIGBATCH_CHECK(config.precision == Precision::fp32,
                 "Gpt::float64: the float64 twin has no mixed precision; set precision fp32");
  return Gpt(config, Device::cpu(), DType::f64);
}

Gpt::Gpt(const GptConfig& config, Device device, DType parameter_dtype)
    : config_(config),
      device_(device),
      parameter_dtype_(parameter_dtype),
      activation_dtype_(parameter_dtype == DType::f64 ? DType::f64
                                                      : working_dtype(config.precision)) {
  check_gpt_config(config);
  const std::int64_t C = config.width;
  const Precision precision = config.precision;
  const DType p = parameter_dtype;
  wte_ = make_table(config.vocabulary, C, device, precision, p);
  wpe_ = make_table(config.context, C, device, precision, p);
  for (std::int64_t i = 0; i < config.layers; ++i) {
    blocks_.push_back({make_norm(Norm::layer, C, device, p),
                       make_linear(C, 3 * C, device, precision, p),
                       make_linear(C, C, device, precision, p),
                       make_norm(Norm::layer, C, device, p),
                       make_linear(C, 4 * C, device, precision, p),
                       make_linear(4 * C, C, device, precision, p)});
  }
  ln_f_ = make_norm(Norm::layer, C, device, p);
  head_grad_ = Tensor::zeros({config.vocabulary, C}, p, device, MemoryCategory::gradients);

  // Weights and tables drawn (stream = the index in parameters()), biases 0; the residual
  // projections scaled down by sqrt(2 N), as GPT-2 does.
  const double projection_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config.layers));
  std::uint64_t index = 0;
  for (const StateEntry& entry : state_entries()) {
    const bool is_norm = entry.name.find(".ln_") != std::string::npos;
    const bool is_bias = entry.name.ends_with(".bias");
    if (is_norm) {
      // make_norm set weight 1, bias 0
    } else if (is_bias) {
      fill(*entry.value, 0.0);
    } else {
      const bool projection = entry.name.ends_with("c_proj.weight");
      init_normal(*entry.value, projection ? projection_std : kInitStd, config.seed, index);
    }
    ++index;
  }
  refresh_half_copies(parameters());  // the working copies from the masters just drawn
}

std::vector<StateEntry> Gpt::state_entries() {
  std::vector<StateEntry> entries;
  entries.push_back({"transformer.wte.weight", &wte_.weight, &wte_.weight_grad, &wte_.weight_half});
  entries.push_back({"transformer.wpe.weight", &wpe_.weight, &wpe_.weight_grad, &wpe_.weight_half});
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const std::string prefix = "transformer.h." + std::to_string(i) + ".";
    append_norm(entries, prefix + "ln_1.", blocks_[i].ln_1);
    append_linear(entries, prefix + "attn.c_attn.", blocks_[i].c_attn);
    append_linear(entries, prefix + "attn.c_proj.", blocks_[i].attn_proj);
    append_norm(entries, prefix + "ln_2.", blocks_[i].ln_2);
    append_linear(entries, prefix + "mlp.c_fc.", blocks_[i].c_fc);
    append_linear(entries, prefix + "mlp.c_proj.", blocks_[i].mlp_proj);
  }
  append_norm(entries, "transformer.ln_f.", ln_f_);
  return entries;
}

std::vector<NamedParameter> Gpt::parameters() const {
  // The entries point into members; nothing is changed.
  return named_parameters(const_cast<Gpt&>(*this).state_entries());
}

std::vector<std::pair<std::string, Tensor>> Gpt::state_dict() const {
  return state_tensors(const_cast<Gpt&>(*this).state_entries());
}

std::int64_t Gpt::parameter_count() const { return count_parameters(parameters()); }

void Gpt::zero_grad() {
  zero_gradients(parameters());
  fill(head_grad_, 0.0);
}

Tensor Gpt::activation_tensor(Shape shape) const {
  return Tensor(std::move(shape), activation_dtype_, device_, MemoryCategory::activations);
}

Tensor Gpt::workspace_tensor(Shape shape) const {
  return Tensor(std::move(shape), activation_dtype_, device_, MemoryCategory::workspace);
}

const Tensor& Gpt::working(const EmbeddingTable& table) const {
  return table.weight_half.defined() ? table.weight_half : table.weight;
}

void Gpt::check_data(const Dataset& data) const {
  BIGBATCH_CHECK(data.holds_tokens() && data.features.dtype() == DType::i32 &&
                     data.features.rank() == 2 && data.labels.shape() == data.features.shape(),
                 "the GPT trains on token sequences (i32 [N, T], a target per token); the data "
                 "set '", data.name, "' holds ", data.features.describe(), " and labels ",
                 data.labels.describe());
  BIGBATCH_CHECK(data.feature_dim() >= 1 && data.feature_dim() <= config_.context,
                 "the data set '", data.name, "' has sequences of ", data.feature_dim(),
                 " tokens, the model's context is ", config_.context);
  BIGBATCH_CHECK(data.num_classes <= config_.vocabulary, "the data set '", data.name,
                 "' has a vocabulary of ", data.num_classes, " tokens, the model's is ",
                 config_.vocabulary);
}

Tensor Gpt::forward(const Tensor& tokens, const ForwardContext& context) {
  constexpr const char* op = "Gpt::forward";
  detail::check_rank(op, "tokens", tokens, 2);
  detail::check_dtype(op, "tokens", tokens, DType::i32);
  BIGBATCH_CHECK(tokens.dim(1) >= 1 && tokens.dim(1) <= config_.context, op,
                 ": sequences must hold 1 to ", config_.context, " tokens (the context), got ",
                 tokens.describe());
  BIGBATCH_CHECK(tokens.device() == device_, op, ": tokens must be on ", device_.name(),
                 ", got ", tokens.describe());
  const std::int64_t b = tokens.dim(0), T = tokens.dim(1), C = config_.width;
  // A new forward replaces what the last one saved.
  saved_blocks_.clear();
  final_input_ = final_out_ = final_mean_ = final_rstd_ = tokens_ = Tensor();
  context_ = context;

  Tensor x = activation_tensor({b, T, C});
  embedding_forward(tokens, working(wte_), working(wpe_), x);
  if (dropout_active(config_, context)) dropout_forward(x, x, site(config_, context, 0));
  std::vector<GptBlockActivations> saved;
  if (!context.training) {
    // Inference: no backward follows, so each block's saved tensors go as soon as the block
    // is done (an evaluation holds one block's activations, not the whole model's).
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      GptBlockActivations transient;
      x = block_forward(i, x, context, transient);
    }
  } else if (runner_) {
    x = runner_->forward(*this, std::move(x), context);  // `saved` stays empty
  } else {
    saved.resize(blocks_.size());
    for (std::size_t i = 0; i < blocks_.size(); ++i) x = block_forward(i, x, context, saved[i]);
  }

  Tensor normed = activation_tensor({b * T, C});
  Tensor mean({b * T}, parameter_dtype_, device_, MemoryCategory::activations);
  Tensor rstd({b * T}, parameter_dtype_, device_, MemoryCategory::activations);
  layernorm_forward(rows(x), ln_f_.weight, ln_f_.bias, normed, mean, rstd, kNormEps);
  Tensor logits({b * T, config_.vocabulary}, parameter_dtype_, device_,
                MemoryCategory::activations);
  gemm(normed, false, working(wte_), true, logits);
  if (context.training) {
    tokens_ = tokens;
    saved_blocks_ = std::move(saved);
    final_input_ = x;
    final_out_ = normed;
    final_mean_ = mean;
    final_rstd_ = rstd;
  }
  return logits;
}

// snippet: block
Tensor Gpt::block_forward(std::size_t index, const Tensor& x, const ForwardContext& context,
                          GptBlockActivations& saved, BlockKeep keep) {
  BIGBATCH_CHECK(keep != BlockKeep::gemm_outputs, "Gpt::block_forward: BlockKeep::gemm_outputs "
                 "is the MLP block's selective recomputation");
  BIGBATCH_CHECK(keep != BlockKeep::all_but_probabilities ||
                     config_.attention == AttentionKernel::plain,
                 "Gpt::block_forward: BlockKeep::all_but_probabilities drops the probabilities "
                 "that efficient attention never keeps");
  const GptBlock& block = blocks_.at(index);
  const std::int64_t b = x.dim(0), T = x.dim(1), n = b * T, C = config_.width;
  const bool dropout = dropout_active(config_, context);
  saved.input = x;

  // x + dropout(attn.c_proj(attention(attn.c_attn(ln_1(x)))))
  saved.ln_1_out = activation_tensor({n, C});
  saved.ln_1_mean = Tensor({n}, parameter_dtype_, device_, MemoryCategory::activations);
  saved.ln_1_rstd = Tensor({n}, parameter_dtype_, device_, MemoryCategory::activations);
  layernorm_forward(rows(x), block.ln_1.weight, block.ln_1.bias, saved.ln_1_out,
                    saved.ln_1_mean, saved.ln_1_rstd, kNormEps);
  saved.qkv = activation_tensor({b, T, 3 * C});
  linear_forward(block.c_attn, saved.ln_1_out, rows(saved.qkv));
  saved.attention = activation_tensor({b, T, C});
  const DropoutSpec attention_dropout =
      dropout ? site(config_, context, attention_stream(index)) : DropoutSpec{};
  if (config_.attention == AttentionKernel::efficient) {
    saved.row_stats = Tensor({b, config_.heads, T, 2}, parameter_dtype_, device_,
                             MemoryCategory::activations);
    efficient_attention_forward(saved.qkv, saved.attention, saved.row_stats, config_.heads,
                                attention_dropout);
  } else {
    saved.probabilities = activation_tensor({b, config_.heads, T, T});
    causal_attention_forward(saved.qkv, saved.attention, saved.probabilities, config_.heads,
                             attention_dropout);
    // Selective attention recomputation: P goes now, block_backward rebuilds it.
    if (keep == BlockKeep::all_but_probabilities) saved.probabilities = Tensor();
  }
  saved.middle = activation_tensor({b, T, C});
  linear_forward(block.attn_proj, rows(saved.attention), rows(saved.middle));
  if (dropout) {
    dropout_forward(saved.middle, saved.middle,
                    site(config_, context, attention_residual_stream(index)));
  }
  axpy(1.0f, x, saved.middle);

  // middle + dropout(mlp.c_proj(gelu(mlp.c_fc(ln_2(middle)))))
  saved.ln_2_out = activation_tensor({n, C});
  saved.ln_2_mean = Tensor({n}, parameter_dtype_, device_, MemoryCategory::activations);
  saved.ln_2_rstd = Tensor({n}, parameter_dtype_, device_, MemoryCategory::activations);
  layernorm_forward(rows(saved.middle), block.ln_2.weight, block.ln_2.bias, saved.ln_2_out,
                    saved.ln_2_mean, saved.ln_2_rstd, kNormEps);
  saved.fc = activation_tensor({n, 4 * C});
  linear_forward(block.c_fc, saved.ln_2_out, saved.fc);
  saved.gelu = activation_tensor({n, 4 * C});
  gelu_forward(saved.fc, saved.gelu);
  Tensor out = activation_tensor({b, T, C});
  linear_forward(block.mlp_proj, saved.gelu, rows(out));
  if (dropout) dropout_forward(out, out, site(config_, context, mlp_residual_stream(index)));
  axpy(1.0f, saved.middle, out);
  return out;
}
// snippet end: block

Tensor Gpt::block_backward(std::size_t index, const GptBlockActivations& saved,
                           const Tensor& d_output, const ForwardContext& context) {
  const GptBlock& block = blocks_.at(index);
  const std::int64_t b = d_output.dim(0), T = d_output.dim(1), n = b * T, C = config_.width;
  const bool dropout = dropout_active(config_, context);

  // The MLP branch: d_output reaches the branch through its dropout, and middle directly.
  Tensor d_branch = d_output;
  if (dropout) {
    d_branch = workspace_tensor({b, T, C});
    dropout_backward(d_output, d_branch, site(config_, context, mlp_residual_stream(index)));
  }
  linear_backward_parameters(block.mlp_proj, saved.gelu, rows(d_branch));
  Tensor d_hidden = workspace_tensor({n, 4 * C});
  linear_backward_input(block.mlp_proj, rows(d_branch), d_hidden);
  gelu_backward(saved.fc, d_hidden, d_hidden);
  linear_backward_parameters(block.c_fc, saved.ln_2_out, d_hidden);
  Tensor d_middle = workspace_tensor({b, T, C});
  linear_backward_input(block.c_fc, d_hidden, rows(d_middle));
  d_hidden = Tensor();
  layernorm_backward(rows(saved.middle), block.ln_2.weight, saved.ln_2_mean, saved.ln_2_rstd,
                     rows(d_middle), rows(d_middle), block.ln_2.weight_grad,
                     block.ln_2.bias_grad);
  axpy(1.0f, d_output, d_middle);  // the residual

  // The attention branch, the same way.
  d_branch = d_middle;
  if (dropout) {
    d_branch = workspace_tensor({b, T, C});
    dropout_backward(d_middle, d_branch,
                     site(config_, context, attention_residual_stream(index)));
  }
  linear_backward_parameters(block.attn_proj, rows(saved.attention), rows(d_branch));
  Tensor d_attention = workspace_tensor({b, T, C});
  linear_backward_input(block.attn_proj, rows(d_branch), rows(d_attention));
  d_branch = Tensor();
  Tensor d_qkv = workspace_tensor({b, T, 3 * C});
  const DropoutSpec attention_dropout =
      dropout ? site(config_, context, attention_stream(index)) : DropoutSpec{};
  if (config_.attention == AttentionKernel::efficient) {
    efficient_attention_backward(saved.qkv, saved.attention, saved.row_stats, d_attention, d_qkv,
                                 config_.heads, attention_dropout);
  } else {
    Tensor probabilities = saved.probabilities;
    if (!probabilities.defined()) {  // dropped by the forward: the same bits again, from q, k
      probabilities = activation_tensor({b, config_.heads, T, T});
      causal_attention_probabilities(saved.qkv, probabilities, config_.heads);
    }
    causal_attention_backward(saved.qkv, probabilities, d_attention, d_qkv, config_.heads,
                              attention_dropout);
  }
  d_attention = Tensor();
  linear_backward_parameters(block.c_attn, saved.ln_1_out, rows(d_qkv));
  Tensor d_input = workspace_tensor({b, T, C});
  linear_backward_input(block.c_attn, rows(d_qkv), rows(d_input));
  d_qkv = Tensor();
  layernorm_backward(rows(saved.input), block.ln_1.weight, saved.ln_1_mean, saved.ln_1_rstd,
                     rows(d_input), rows(d_input), block.ln_1.weight_grad, block.ln_1.bias_grad);
  axpy(1.0f, d_middle, d_input);  // the residual
  return d_input;
}

void Gpt::backward(const Tensor& d_logits) {
  constexpr const char* op = "Gpt::backward";
  BIGBATCH_CHECK(tokens_.defined(), op, ": no training forward() to take the gradient of");
  const std::int64_t b = tokens_.dim(0), T = tokens_.dim(1), C = config_.width;
  detail::check_dtype(op, "d_logits", d_logits, parameter_dtype_);
  detail::check_shape(op, "d_logits", d_logits, {b * T, config_.vocabulary});
  const ForwardContext context = context_;

  // The head: d_logits in the working type (f32 under fp32: as they are).
  Tensor d_head = d_logits;
  if (d_logits.dtype() != activation_dtype_) {
    d_head = workspace_tensor(d_logits.shape());
    cast(d_logits, d_head);
  }
  gemm(d_head, true, final_out_, false, head_grad_, 1.0f, 1.0f);
  Tensor dx = workspace_tensor({b, T, C});
  gemm(d_head, false, working(wte_), false, rows(dx));
  d_head = Tensor();
  layernorm_backward(rows(final_input_), ln_f_.weight, final_mean_, final_rstd_, rows(dx),
                     rows(dx), ln_f_.weight_grad, ln_f_.bias_grad);
  final_input_ = final_out_ = final_mean_ = final_rstd_ = Tensor();

  if (runner_) {
    dx = runner_->backward(*this, std::move(dx), context);
  } else {
    for (std::size_t i = blocks_.size(); i-- > 0;) {
      dx = block_backward(i, saved_blocks_[i], dx, context);
      saved_blocks_[i] = GptBlockActivations{};  // no longer needed
    }
  }
  if (dropout_active(config_, context)) dropout_backward(dx, dx, site(config_, context, 0));
  embedding_backward(tokens_, dx, wte_.weight_grad, wpe_.weight_grad);
  tokens_ = Tensor();
  saved_blocks_.clear();
}

void Gpt::complete_gradients() {
  axpy(1.0f, head_grad_, wte_.weight_grad);
  fill(head_grad_, 0.0);
}

void Gpt::save(const std::string& path) const {
  const std::map<std::string, std::string> metadata = {
      {"format", "bigbatch GPT"},
      {"vocabulary", std::to_string(config_.vocabulary)},
      {"context", std::to_string(config_.context)},
      {"layers", std::to_string(config_.layers)},
      {"width", std::to_string(config_.width)},
      {"heads", std::to_string(config_.heads)},
  };
  save_safetensors(path, state_dict(), metadata);
}

void Gpt::load(const std::string& path) { load_state_dict(load_safetensors(path), path); }

void Gpt::load_state_dict(const std::map<std::string, Tensor>& tensors, const std::string& source) {
  load_state(state_dict(), tensors, source);
  refresh_half_copies(parameters());  // the working copies from the values just loaded
}

}  // namespace bigbatch::nn
