// gpt.hpp: chapter 08's model, the one readers actually train: a GPT-2-style decoder
// (nanoGPT's GPT, with biases) on the same kernels as the residual MLP of chapters 00-07.
//
//   x = dropout(wte[tokens] + wpe[positions])               embeddings       [b*T, C]
//   N times:                                                 transformer.h.i
//     x = x + dropout(attn.c_proj(attention(attn.c_attn(ln_1(x)))))
//     x = x + dropout(mlp.c_proj(gelu(mlp.c_fc(ln_2(x)))))   c_fc: C -> 4C, c_proj: 4C -> C
//   logits = ln_f(x) wte^T                                   the head, tied to wte [b*T, V]
//
// Parameter names, their order and the initialisation are nanoGPT's (docs/model.md). Row
// s*T + t is token t of sequence s. backward() adds (+=) into the parameter gradients, as the
// MLP's; the head's share of wte's gradient is added by complete_gradients(), once per
// optimizer step, after the last micro-batch's backward. Gpt::float64() is an all-f64 twin.
// Why and how: docs/internals.md#nngpthpp
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/model.hpp"

namespace bigbatch::nn {

struct StateEntry;  // layers.hpp

/// How each block computes its attention (kernels/attention.hpp): plain keeps the
/// probabilities P, b heads T^2 elements a block, for the backward; efficient keeps each query
/// row's running max and sum instead (two f32 a row, b heads T 8 bytes a block) and rebuilds P
/// tile by tile in the backward. The two round differently (the online softmax rescales its
/// sums), so the choice is part of a run's trajectory.
enum class AttentionKernel { plain, efficient };

/// "plain", "efficient".
std::string attention_kernel_name(AttentionKernel kernel);
/// The attention kernel as a setting (common/settings.hpp): attention_kernel_name.
inline std::string setting_text(AttentionKernel kernel) { return attention_kernel_name(kernel); }

/// The transformer's sizes and choices.
struct GptConfig {
  std::int64_t vocabulary = 256;  ///< V, token ids in [0, V) (256: bytes)
  std::int64_t context = 0;       ///< the longest sequence, nanoGPT's block_size (wpe's rows)
  std::int64_t layers = 0;        ///< N, transformer blocks
  std::int64_t width = 0;         ///< C, the residual stream (n_embd)
  std::int64_t heads = 1;         ///< attention heads, dividing C
  float dropout = 0.0f;           ///< p of every dropout
  std::uint64_t seed = 0;         ///< initialisation seed
  Precision precision = Precision::fp32;  ///< fp16, bf16: mixed precision
  AttentionKernel attention = AttentionKernel::plain;  ///< the attention's kernels
};

/// GptConfig's settings (common/settings.hpp), named by `bigbatch train --model gpt`'s flags;
/// each one shapes the model or its initial parameters, so each is a trajectory setting.
template <SettingsOf<GptConfig> Self, class Visit>
constexpr void visit_settings(Self& c, Visit&& visit) {
  visit("vocabulary", c.vocabulary, SettingRole::trajectory);
  visit("seq-len", c.context, SettingRole::trajectory);
  visit("layers", c.layers, SettingRole::trajectory);
  visit("width", c.width, SettingRole::trajectory);
  visit("heads", c.heads, SettingRole::trajectory);
  visit("dropout", c.dropout, SettingRole::trajectory);
  visit("seed", c.seed, SettingRole::trajectory);
  visit("precision", c.precision, SettingRole::trajectory);
  visit("attention", c.attention, SettingRole::trajectory);
}
static_assert(every_field_visited<GptConfig>(), "classify GptConfig's new field above");

/// An embedding table (wte or wpe): the f32 value (the master when mixed), its gradient, and
/// its 16-bit working copy when mixed.
struct EmbeddingTable {
  Tensor weight;       ///< [rows, C], f32 (f64 for the float64 twin)
  Tensor weight_grad;  ///< the same shape and dtype, accumulated (+=)
  Tensor weight_half;  ///< the working copy under mixed precision, else undefined
};

/// One transformer block's parameters (nanoGPT's Block).
struct GptBlock {
  NormLayer ln_1;       ///< LayerNorm before the attention
  Linear c_attn;        ///< attn.c_attn, C -> 3C (q, k, v side by side)
  Linear attn_proj;     ///< attn.c_proj, C -> C
  NormLayer ln_2;       ///< LayerNorm before the MLP
  Linear c_fc;          ///< mlp.c_fc, C -> 4C
  Linear mlp_proj;      ///< mlp.c_proj, 4C -> C
};

/// What one block's forward saves for its backward: b sequences of T positions, n = b*T rows.
struct GptBlockActivations {
  Tensor input;                       ///< x entering the block, ln_1's input [b, T, C]
  Tensor ln_1_out;                    ///< ln_1(x), c_attn's input                [n, C]
  Tensor ln_1_mean;                   ///< ln_1's row means                 [n] f32 (f64)
  Tensor ln_1_rstd;                   ///< ln_1's 1 / sqrt(var + eps)        [n] f32 (f64)
  Tensor qkv;                         ///< c_attn's output, attention's input [b, T, 3C]
  Tensor probabilities;               ///< plain attention's P               [b, heads, T, T]
  Tensor row_stats;                   ///< efficient attention's (m, l) [b, heads, T, 2] f32 (f64)
  Tensor attention;                   ///< the heads' output, c_proj's input  [b, T, C]
  Tensor middle;                      ///< x after the attention's residual   [b, T, C]
  Tensor ln_2_out;                    ///< ln_2(middle), c_fc's input             [n, C]
  Tensor ln_2_mean;                   ///< ln_2's row means                 [n] f32 (f64)
  Tensor ln_2_rstd;                   ///< ln_2's 1 / sqrt(var + eps)        [n] f32 (f64)
  Tensor fc;                          ///< c_fc's output, GELU's input          [n, 4C]
  Tensor gelu;                        ///< GELU's output, mlp.c_proj's input    [n, 4C]
};

/// The bytes a training forward() keeps for backward() (MemoryCategory::activations) for b
/// sequences of T positions, n = b T rows, W bytes per element of the working dtype, f32
/// statistics and logits:
///   embeddings: the blocks' input x0                                       W n C
///   per block:  ln_1(x), qkv (3), the heads' output, middle, ln_2(middle), c_fc's output (4),
///               GELU's output (4) and the block's output, the next one's input: 16 W n C;
///               the attention's P: W b heads T^2 (AttentionKernel::efficient: its rows' max
///               and sum instead, 8 b heads T); four LayerNorm statistics: 16 n
///   head:       ln_f(x) W n C, its two statistics 8 n, the logits 4 n V
/// No dropout mask is kept (the counter-based RNG draws each again in the backward), nor the
/// dropped probabilities (recomputed from P): in 16 bits a block keeps 32 n C + 2 b heads T^2
/// bytes where Korthikanti et al. (2022) count 34 n C + 5 b heads T^2 (they keep three masks,
/// one byte an element: n C for each residual branch and b heads T^2 for the attention's,
/// and the 2 b heads T^2 of the attention dropout's output), plus its 16 n bytes of
/// statistics, which they leave out.
struct GptSavedBytes {
  std::size_t embeddings = 0;  ///< x0
  std::size_t per_block = 0;   ///< one block's
  std::size_t head = 0;        ///< ln_f's output and statistics, and the logits
  /// All of a model of `layers` blocks.
  std::size_t total(std::int64_t layers) const {
    return embeddings + static_cast<std::size_t>(layers) * per_block + head;
  }
};

/// GptSavedBytes for `config` (its precision's working dtype) and b sequences of T positions.
GptSavedBytes gpt_saved_bytes(const GptConfig& config, std::int64_t sequences,
                              std::int64_t length);

/// The trainable elements of the GPT `config` describes (its parameter_count()), from the
/// configuration alone: V C + T C + N (12 C^2 + 13 C) + 2 C. Throws std::invalid_argument
/// for a negative size or a count past 64 bits.
std::int64_t gpt_parameter_count(const GptConfig& config);

/// Throws std::invalid_argument for sizes no GPT has (heads not dividing the width, a
/// parameter count past 64 bits, ...): the constructor's checks, without building anything.
void check_gpt_config(const GptConfig& config);

class Gpt;

/// How forward() and backward() run the transformer blocks (network.hpp): h0 is the
/// embeddings' output (after their dropout), h_n ln_f's input.
using GptBlockRunner = BlockRunnerFor<Gpt>;

/// The decoder described above, its parameters, gradients and saved activations on one device.
class Gpt : public Network {
 public:
  /// What block_forward keeps of one block for its backward (a block runner holds these).
  using SavedBlock = GptBlockActivations;

  /// Parameters initialised as nanoGPT's (above); gradients zero. Throws
  /// std::invalid_argument for sizes that do not fit (heads not dividing the width, ...).
  Gpt(const GptConfig& config, Device device);
  /// The same model on the CPU with every tensor f64 (config.precision must be fp32): the
  /// float64 twin the tests take finite differences of.
  static Gpt float64(const GptConfig& config);

  /// The configuration the model was built with.
  const GptConfig& config() const { return config_; }
  /// Its transformer blocks, the chain a block runner runs: config().layers.
  std::int64_t blocks() const { return config_.layers; }
  /// Whether block_forward can keep what `keep` says: all, or all but the attention's
  /// probabilities (which memory-efficient attention keeps none of to drop).
  static bool keeps(BlockKeep keep) { return keep != BlockKeep::gemm_outputs; }
  /// The device that holds every tensor.
  Device device() const override { return device_; }
  /// The dtype of activations and their gradients (f64 for the float64 twin).
  DType activation_dtype() const { return activation_dtype_; }

  /// The trainable tensors in nanoGPT's named_parameters() order.
  std::vector<NamedParameter> parameters() const override;
  /// Every parameter by name, in the same order (a GPT has no buffers).
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  /// The number of trainable elements.
  std::int64_t parameter_count() const override;
  /// Sets every parameter gradient, and the head's share of wte's, to 0.
  void zero_grad() override;

  /// logits [b*T, V] (f32; f64 for the twin; MemoryCategory::activations) of tokens [b, T]
  /// i32 in [0, V), 1 <= T <= context; in training saves what backward() needs.
  Tensor forward(const Tensor& tokens, const ForwardContext& context) override;
  /// Adds (+=) the gradients of the loss given d_logits [b*T, V] (the logits' dtype) of the
  /// last forward(); the head's share of wte's gradient goes to its own buffer (above).
  void backward(const Tensor& d_logits) override;
  /// Adds the head's share into wte's gradient and zeroes it: once per optimizer step, after
  /// the last micro-batch's backward.
  void complete_gradients() override;
  /// Refuses (std::invalid_argument) a data set that is not token sequences (i32 [N, T],
  /// 1 <= T <= the context, targets [N, T]) of at most config().vocabulary tokens.
  void check_data(const Dataset& data) const override;

  /// Runs the blocks through `runner` from now on (null: every block's activations are
  /// kept, the default). Activation checkpointing (chapter 05's ScheduledRunner) keeps fewer
  /// and recomputes the rest; the gradients are the same bits (a recomputed block draws the
  /// same dropout masks from the counter RNG).
  void set_block_runner(std::shared_ptr<GptBlockRunner> runner) { runner_ = std::move(runner); }

  /// One block's forward on x [b, T, C]: returns the block's output and fills `saved`.
  /// BlockKeep::all_but_probabilities leaves saved.probabilities undefined (selective
  /// attention recomputation); BlockKeep::gemm_outputs is the MLP's (std::invalid_argument).
  Tensor block_forward(std::size_t index, const Tensor& x, const ForwardContext& context,
                       GptBlockActivations& saved, BlockKeep keep = BlockKeep::all);
  /// One block's backward: adds its parameter gradients (+=), returns dL/dx (=). Without
  /// saved probabilities it rebuilds them from qkv (causal_attention_probabilities: the
  /// forward's bits, MemoryCategory::activations) for the attention's backward alone.
  Tensor block_backward(std::size_t index, const GptBlockActivations& saved,
                        const Tensor& d_output, const ForwardContext& context);

  /// Writes state_dict() to a safetensors file (metadata: the config).
  void save(const std::string& path) const;
  /// Reads a file written by save() into this model (names, dtypes and shapes checked first).
  void load(const std::string& path);
  /// The same from tensors already read (a snapshot's), named as state_dict() names them;
  /// `source` names where they came from in the errors. Checks every tensor before it
  /// changes any, then writes the 16-bit working copies from the f32 values.
  void load_state_dict(const std::map<std::string, Tensor>& tensors,
                       const std::string& source) override;

 private:
  Gpt(const GptConfig& config, Device device, DType parameter_dtype);
  std::vector<StateEntry> state_entries();
  Tensor activation_tensor(Shape shape) const;
  Tensor workspace_tensor(Shape shape) const;
  const Tensor& working(const EmbeddingTable& table) const;

  GptConfig config_;
  Device device_;
  DType parameter_dtype_, activation_dtype_;
  EmbeddingTable wte_, wpe_;
  std::vector<GptBlock> blocks_;
  NormLayer ln_f_;
  std::shared_ptr<GptBlockRunner> runner_;  // null: every block's activations are kept
  Tensor head_grad_;  // the head's share of wte's gradient, until complete_gradients()

  // What the last training forward saved.
  ForwardContext context_;
  Tensor tokens_;
  std::vector<GptBlockActivations> saved_blocks_;
  Tensor final_input_, final_out_, final_mean_, final_rstd_;
};

}  // namespace bigbatch::nn
