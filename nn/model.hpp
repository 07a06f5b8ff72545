// model.hpp: the model every chapter trains, written once for every backend on the ops
// of kernels/: a pre-norm residual MLP, the feed-forward half of a transformer.
//
//   stem:    h = act(stem(x))                          stem: Linear(D, H)
//   blocks:  h = h + fc2(dropout(act(fc1(ln(h)))))     depth times; fc1: Linear(H, E*H),
//                                                      fc2: Linear(E*H, H)
//   head:    logits = head(head.ln(h))                 head: Linear(H, C), its own norm
//
// backward() ADDS (+=) into the parameter gradients (call zero_grad() before a batch's first
// micro-batch) and overwrites (=) the activation gradients. Inputs are [b, D] f32, labels
// [b] i32, logits [b, C] f32, in every precision (fp32, fp16, bf16). A sample draws the
// same dropout mask in a batch and in a micro-batch. The saved activations of one block are
// one BlockActivations, so a later chapter can drop them and recompute them.
// Why and how (norms, bits, memory, the precision table): docs/internals.md#nnmodelhpp
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/device.hpp"
#include "common/settings.hpp"
#include "common/tensor.hpp"
#include "nn/network.hpp"

namespace bigbatch::nn {

/// The norm of every block and of the head: LayerNorm or BatchNorm1d.
enum class Norm { layer, batch };
/// fp32, or mixed precision with fp16 or bf16 working copies (the table above).
enum class Precision { fp32, fp16, bf16 };

/// Whether `precision` is mixed: a 16-bit working copy beside f32 masters (fp16, bf16).
constexpr bool is_mixed(Precision precision) { return precision != Precision::fp32; }

/// The dtype of activations, their gradients and the working copies: f32, f16 or bf16.
DType working_dtype(Precision precision);
/// The activation after the stem and inside every block.
enum class Activation { gelu, relu };

/// The model's sizes and choices.
struct ModelConfig {
  std::int64_t inputs = 0;     ///< D, features per sample
  std::int64_t hidden = 0;     ///< H, width of the residual stream
  std::int64_t expansion = 4;  ///< E, the blocks' inner width is E * H
  std::int64_t classes = 0;    ///< C
  std::int64_t depth = 0;      ///< residual blocks; 0 gives a one-hidden-layer MLP
  float dropout = 0.0f;        ///< p of the dropout inside every block
  /// The norm of the blocks and the head.
  Norm norm = Norm::layer;
  /// act, after the stem and in every block.
  Activation activation = Activation::gelu;
  std::uint64_t seed = 0;  ///< initialisation seed
  Precision precision = Precision::fp32;  ///< fp16, bf16: mixed precision (the table above)
};

/// ModelConfig's settings (common/settings.hpp): the data decides inputs and classes.
template <SettingsOf<ModelConfig> Self, class Visit>
constexpr void visit_settings(Self& c, Visit&& visit) {
  visit("inputs", c.inputs, SettingRole::implied);
  visit("hidden", c.hidden, SettingRole::trajectory);
  visit("expansion", c.expansion, SettingRole::trajectory);
  visit("classes", c.classes, SettingRole::implied);
  visit("depth", c.depth, SettingRole::trajectory);
  visit("dropout", c.dropout, SettingRole::trajectory);
  visit("norm", c.norm, SettingRole::trajectory);
  visit("activation", c.activation, SettingRole::trajectory);
  visit("seed", c.seed, SettingRole::trajectory);
  visit("precision", c.precision, SettingRole::trajectory);
}
static_assert(every_field_visited<ModelConfig>(), "classify ModelConfig's new field above");

/// nn.Linear(in, out): y = x W^T + b.
struct Linear {
  /// \var weight
  /// W, f32 [out, in]; under mixed precision the master copy the optimizer updates.
  /// \var bias
  /// b, f32 [out].
  Tensor weight, bias;            // [out, in], [out]
  /// \var weight_grad
  /// dL/dW, f32 [out, in], accumulated (+=).
  /// \var bias_grad
  /// dL/db, f32 [out], accumulated (+=).
  Tensor weight_grad, bias_grad;  // the same shapes
  /// The 16-bit working copy of W that the forward reads under mixed precision.
  Tensor weight_half;             // [out, in] f16 or bf16 when mixed, else undefined
};

/// nn.LayerNorm(H) or nn.BatchNorm1d(H): weight (gamma), bias (beta), and for BatchNorm
/// the running statistics (undefined for LayerNorm).
struct NormLayer {
  /// \var weight
  /// gamma, f32 [H], initialised to 1.
  /// \var bias
  /// beta, f32 [H], initialised to 0.
  Tensor weight, bias;            // [H]
  /// \var weight_grad
  /// The gradient of gamma, f32 [H], accumulated (+=).
  /// \var bias_grad
  /// The gradient of beta, f32 [H], accumulated (+=).
  Tensor weight_grad, bias_grad;  // [H]
  /// \var running_mean
  /// BatchNorm's running mean, f32 [H], initialised to 0; undefined for LayerNorm.
  /// \var running_var
  /// BatchNorm's running variance, f32 [H], initialised to 1; undefined for LayerNorm.
  Tensor running_mean, running_var;
};

/// A residual block's parameters.
struct Block {
  /// The norm at the block's entry (pre-norm).
  NormLayer ln;
  /// \var fc1
  /// Linear(H, E*H), the expansion.
  /// \var fc2
  /// Linear(E*H, H), back to the residual stream.
  Linear fc1, fc2;
};

/// What a block's forward saves for its backward (b rows; stats [b] for LayerNorm,
/// [H] for BatchNorm).
struct BlockActivations {
  /// The block's input h.
  Tensor input;           // h entering the block      [b, H]
  /// ln(h); undefined under BlockKeep::gemm_outputs.
  Tensor normed;          // ln(h), fc1's input        [b, H]
  /// \var mean
  /// ln's mean, f32.
  /// \var rstd
  /// ln's 1 / sqrt(var + eps), f32.
  Tensor mean, rstd;      // ln's statistics
  /// fc1's output, the activation's input.
  Tensor pre_activation;  // fc1(ln(h))                [b, E*H]
  /// fc2's input; undefined under BlockKeep::gemm_outputs.
  Tensor hidden;          // dropout(act(...)), fc2's input [b, E*H]
};

/// What block_forward keeps for the block's backward.
enum class BlockKeep {
  all,           ///< every activation the backward reads (the default)
  gemm_outputs,  ///< selective recomputation: the input, the norm's statistics and fc1's
                 ///< output only; block_backward recomputes the norm's output and the
                 ///< activation after dropout, which cost no matrix product
  all_but_probabilities,  ///< a transformer block's (nn::Gpt) selective attention
                          ///< recomputation: everything but the attention's probabilities
                          ///< (b heads T^2), which block_backward rebuilds from q and k
};

/// Everything one forward() saved: the stem, the blocks, the head.
struct SavedActivations {
  /// The context forward() ran with.
  ForwardContext context;
  /// The input as the stem read it.
  Tensor input;                  // x (f32: not copied; fp16: rounded) [b, D]
  /// The stem's output before its activation.
  Tensor stem_pre_activation;    // stem(x)                [b, H]
  /// One per residual block; empty when a BlockRunner ran the blocks.
  std::vector<BlockActivations> blocks;
  /// h after the last block (the stem's output when depth is 0).
  Tensor head_input;             // h entering the head    [b, H]
  /// head.ln(h), the head's Linear input.
  Tensor head_normed;            // head.ln(h)             [b, H]
  /// \var head_mean
  /// head.ln's mean, f32.
  /// \var head_rstd
  /// head.ln's 1 / sqrt(var + eps), f32.
  Tensor head_mean, head_rstd;   // head.ln's statistics
};

// nn::GradientsReady (network.hpp): Model::backward tells the head's four gradients, then
// each block's six (block i: [2 + 6 i, 8 + 6 i)) from the last block to the first,
// checkpointed or not, then the stem's two ([0, 2)).

class Model;

/// How forward() and backward() run the residual blocks between the stem and the head
/// (network.hpp): h0 is the stem's output.
using BlockRunner = BlockRunnerFor<Model>;

/// The pre-norm residual MLP described above, its parameters, gradients and saved
/// activations on one device.
class Model : public Network {
 public:
  /// What block_forward keeps of one block for its backward (a block runner holds these).
  using SavedBlock = BlockActivations;

  /// Parameters initialised as PyTorch initialises them (Linear: weight and bias uniform
  /// in [-1/sqrt(in), 1/sqrt(in)]; norm weight 1, bias 0, running mean 0, var 1), drawn
  /// from random_uniform(config.seed, stream = the parameter's index in parameters(),
  /// element index): deterministic and independent of the device. Gradients are zero.
  Model(const ModelConfig& config, Device device);

  /// The configuration the model was built with.
  const ModelConfig& config() const { return config_; }
  /// Its residual blocks, the chain a block runner runs: config().depth.
  std::int64_t blocks() const { return config_.depth; }
  /// Whether block_forward can keep what `keep` says: all, or the GEMM outputs alone.
  static bool keeps(BlockKeep keep) { return keep != BlockKeep::all_but_probabilities; }
  /// The device that holds every tensor of the model.
  Device device() const override { return device_; }
  /// The dtype of activations and their gradients: working_dtype(config().precision).
  DType activation_dtype() const;

  /// The trainable tensors in PyTorch's named_parameters() order.
  std::vector<NamedParameter> parameters() const override;
  /// Parameters and buffers (BatchNorm's running statistics) in state_dict() order.
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  /// The number of trainable elements: the sum of numel() over parameters().
  std::int64_t parameter_count() const override;

  /// Sets every parameter gradient to 0 (a released one is left released: it is 0 when a
  /// backward allocates it again).
  void zero_grad() override;
  /// Releases the gradient buffers of parameters()[first, end): their bytes go back to the
  /// allocator and parameters() shows them undefined, until a backward() needs them and
  /// allocates them again, as zeros, just before it adds into them (the head's as the
  /// backward starts, a block's as block_backward starts, the stem's last). ZeRO stage 2
  /// (chapter 07) keeps only its shard of each gradient, so it releases the model's
  /// gradients as soon as their sum over ranks is taken.
  void release_gradients(std::size_t first, std::size_t end) override;
  /// Releases the f32 masters of the Linear weights under mixed precision (fp32 has none):
  /// parameters() shows their values undefined, and state_dict(), save() and loading
  /// refuse, until allocate_master_weights() brings them back. The forward and the backward
  /// read only the 16-bit working copies, so training goes on when whoever steps the
  /// weights holds their masters: ZeRO stages 1 and 2 (chapter 07) keep each rank's shard
  /// of every master, and the model the working copies, whole.
  void release_master_weights() override;
  /// Allocates every released master again (MemoryCategory::master_weights), its values
  /// unset: the caller writes them (chapter 07 gathers the ranks' shards into them).
  void allocate_master_weights() override;
  /// Whether the model holds its f32 masters (always under fp32, which has none).
  bool holds_master_weights() const override { return !masters_released_; }
  /// The MLP tells its gradients group by group and releases gradients and masters.
  bool releases_state() const override { return true; }

  /// logits [b, C] (MemoryCategory::activations) of x [b, D] f32; in training saves what
  /// backward() needs, replacing what an earlier forward() saved (an inference forward,
  /// context.training false, keeps no block's activations and allows no backward).
  /// BatchNorm in training updates its running statistics and needs b >= 2.
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  /// Adds (+=) the gradients of the loss with respect to every parameter, given dlogits
  /// [b, C] f32 of the last forward(); releases the saved activations as it goes.
  void backward(const Tensor& dlogits) override;
  /// Refuses (std::invalid_argument) a data set that is not f32 [N, inputs] with labels [N]
  /// of at most config().classes classes.
  void check_data(const Dataset& data) const override;

  /// The building blocks of forward() and backward() for one residual block, for
  /// activation checkpointing: block_forward returns the block's output [b, H] and
  /// fills `saved`; block_backward adds the block's parameter gradients (+=) and returns
  /// the gradient with respect to its input (=), given the gradient of its output.
  /// With BlockKeep::gemm_outputs, `saved.normed` and `saved.hidden` are left undefined
  /// and block_backward recomputes them from the rest, to the same bits.
  Tensor block_forward(std::size_t index, const Tensor& h, const ForwardContext& context,
                       BlockActivations& saved, BlockKeep keep = BlockKeep::all);
  /// See block_forward: adds block `index`'s parameter gradients (+=) and returns dL/dh (=).
  Tensor block_backward(std::size_t index, const BlockActivations& saved, const Tensor& d_output,
                        const ForwardContext& context);

  /// Hands the residual blocks to `runner` in every later forward() and backward()
  /// (nullptr: keep every block's activations, the default).
  void set_block_runner(std::shared_ptr<BlockRunner> runner) { runner_ = std::move(runner); }
  /// Tells `ready` about every group of final gradients in every later backward() (an
  /// empty function: nobody is told, the default).
  void set_gradients_ready(GradientsReady ready) override { gradients_ready_ = std::move(ready); }

  /// What the last forward() saved, until backward() takes it over.
  const SavedActivations& saved_activations() const { return saved_; }
  /// True between a forward() and the backward() that releases its activations.
  bool has_saved_activations() const { return saved_.input.defined() && saved_.context.training; }

  /// Writes state_dict() to a safetensors file (metadata: the config). With its f32
  /// masters released, each comes from `masters` (name to a whole tensor, e.g. gathered
  /// from the ranks' shards into host memory); one missing there is refused.
  void save(const std::string& path, const std::map<std::string, Tensor>& masters = {}) const;
  /// Reads a file written by save() (or by PyTorch's safetensors.torch.save_file on the
  /// equivalent module, without num_batches_tracked) into this model's tensors. Throws
  /// std::runtime_error when a name is missing or extra or a shape differs.
  void load(const std::string& path);
  /// The same from tensors already read (any device), named as state_dict() names them;
  /// `source` names where they came from in the errors. Checks every tensor before it
  /// changes any, so a bad set leaves the model as it was.
  void load_state_dict(const std::map<std::string, Tensor>& tensors,
                       const std::string& source) override;

 private:
  Tensor norm_forward(const NormLayer& layer, const Tensor& x, bool training, Tensor& mean,
                      Tensor& rstd, bool update_running = true);
  Tensor norm_backward(const NormLayer& layer, const Tensor& x, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dy);
  Tensor activation_tensor(Shape shape) const;  // activation_dtype(), activations
  Tensor workspace_tensor(Shape shape) const;   // activation_dtype(), workspace
  /// Writes every 16-bit working copy from its f32 master (no-op under fp32).
  void refresh_half_copies();
  /// Allocates, as zeros, the gradients of parameters()[first, end) that were released.
  void allocate_released_gradients(std::size_t first, std::size_t end);
  /// Tells gradients_ready_, if set, that parameters()[first, end) are final.
  void gradients_final(std::size_t first, std::size_t end) const {
    if (gradients_ready_) gradients_ready_(first, end);
  }

  ModelConfig config_;
  Device device_;
  Linear stem_;
  std::vector<Block> blocks_;
  NormLayer head_ln_;
  Linear head_;
  SavedActivations saved_;
  std::shared_ptr<BlockRunner> runner_;  // null: every block's activations are kept
  GradientsReady gradients_ready_;       // empty: nobody is told
  std::size_t released_gradients_ = 0;   // gradient tensors released and not yet back
  bool masters_released_ = false;        // release_master_weights, until allocated again
};

std::string norm_name(Norm norm);              ///< "layer", "batch"
std::string precision_name(Precision precision);  ///< "fp32", "fp16", "bf16"
std::string activation_name(Activation act);  ///< "gelu", "relu"

/// The norm as a setting (common/settings.hpp): norm_name.
inline std::string setting_text(Norm norm) { return norm_name(norm); }
/// The precision as a setting: precision_name.
inline std::string setting_text(Precision precision) { return precision_name(precision); }
/// The activation as a setting: activation_name.
inline std::string setting_text(Activation act) { return activation_name(act); }

}  // namespace bigbatch::nn
