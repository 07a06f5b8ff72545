// memory_model.hpp: the bytes a training step of the model needs, predicted from its
// configuration alone, category by category (common/memory.hpp). Tests and chapter demos
// hold these predictions against the tracking allocator's counts, to the byte.
//
// Two levels:
//
// predict_memory: the totals, as formulas.
//   parameters       Linear weights: 4 bytes each (fp32), or 2 (fp16, bf16: the working
//                    copy);
//                    biases and norm weights: 4 bytes each; BatchNorm's running statistics
//   master_weights   fp16 and bf16 only: the Linear weights' f32 masters, 4 bytes each
//   gradients        4 bytes per trainable parameter (f32 in every precision)
//   adamw_state      AdamW's exp_avg and exp_avg_sq: 8 bytes per trainable parameter
//   activations      what forward() saves for backward() for `rows` samples, its peak (at
//                    the end of forward): per sample, with s the activations' element size
//                    (4 fp32, 2 fp16 or bf16): the stem's pre-activation and output (2H s); per block
//                    the normed input, fc1's output, the hidden layer after dropout and the
//                    block's output ((2H + 2EH) s) and LayerNorm's mean and rstd (8); the
//                    head's normed input (H s) and statistics (8); the logits (4C, f32 in
//                    every precision); under fp16 and bf16 also the input rounded to 16
//                    bits (2D). LayerNorm only. (fp16 and bf16 take the same bytes.)
//
// predict_step: the whole step, moment by moment. A step's peak is not the end of the
// forward pass: the backward pass allocates gradients of activations (workspace) while
// activations are still held, and activation checkpointing recomputes blocks in the middle
// of it. So the step is replayed on a MemoryLedger: every tensor forward(), the loss and
// backward() allocate, of the same size and category, created and released at the same
// moments as in nn/model.cpp and nn/training.cpp (kernels' own workspace included). The
// ledger keeps the allocator's books (MemoryStats, the same peak rules) and names the
// allocation at which the total peaked. ModelLedger is the model's part, block by block,
// so a driver that runs the blocks differently (chapter 05's checkpointing) replays its
// own order through BlockLedgerRunner, as it runs through nn::BlockRunner.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/memory.hpp"
#include "nn/gpt.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::nn {

/// predict_memory's totals in bytes, by category (the formulas above).
struct PredictedBytes {
  /// \var parameters
  /// MemoryCategory::parameters: the Linear weights the forward reads, biases, norm weights.
  /// \var master_weights
  /// MemoryCategory::master_weights: the f32 Linear weights under fp16 or bf16, else 0.
  /// \var gradients
  /// MemoryCategory::gradients: 4 bytes per trainable parameter.
  /// \var adamw_state
  /// AdamW's two moments: 8 bytes per trainable parameter.
  std::size_t parameters = 0, master_weights = 0, gradients = 0, adamw_state = 0;
  std::size_t activations = 0;  ///< saved by one forward() of `rows` samples
};

/// The prediction for a model of this configuration and a forward pass of `rows` samples.
/// Throws std::invalid_argument for BatchNorm (its statistics are per feature, not per
/// sample: not modelled by this formula; predict_step models both norms).
PredictedBytes predict_memory(const ModelConfig& config, std::int64_t rows);

/// The element counts of a model's trainable tensors, one per Model::parameters() entry
/// (in no particular order): what sharding splits tensor by tensor (chapter 07's ZeRO).
std::vector<std::int64_t> trainable_sizes(const ModelConfig& config);
/// The element counts of the Linear weights, the tensors with an f32 master under mixed
/// precision (whatever the config's precision).
std::vector<std::int64_t> master_weight_sizes(const ModelConfig& config);
/// Bytes of optimizer state per trainable parameter: AdamW 8 (two moments), SGD with
/// momentum 4, plain SGD 0.
std::size_t optimizer_state_bytes_per_parameter(const Optimizer::Options& options);

/// The bytes of the parameters alone (MemoryCategory::parameters: the working copies, and
/// BatchNorm's running statistics), from closed formulas, at no cost for any size (SIZE_MAX
/// where the count passes 64 bits). Every step holds at least these, on every rank (ZeRO
/// never shards them): a floor to refuse a model the device cannot hold before its step is
/// replayed, which takes memory in proportion to the depth.
std::size_t parameter_bytes(const ModelConfig& config);
/// The same for the GPT: wte, wpe, the blocks and ln_f.
std::size_t parameter_bytes(const GptConfig& config);

/// What a described allocation is, in at most four pieces of text, joined only where the
/// allocation sets the peak (the one moment a ledger keeps): a prediction replays
/// thousands of allocations, and naming each of them in a string of its own took most of
/// its time. A Moment views its pieces: make it in the call that takes it.
class Moment {
 public:
  /// `text` alone (implicit, so that a string is a Moment).
  Moment(const char* text) : Moment(std::string_view(text)) {}  // NOLINT
  /// `text` alone; the string must outlive the Moment.
  Moment(const std::string& text) : Moment(std::string_view(text)) {}  // NOLINT
  /// `text` alone.
  Moment(std::string_view text) : pieces_{text}, count_(1) {}  // NOLINT
  /// `prefix` then `what` ("block 3 backward: " and "fc2's input gradient").
  Moment(std::string_view prefix, std::string_view what) : pieces_{prefix, what}, count_(2) {}
  /// `label`, a comma and `what` ("micro-batch 1", what).
  static Moment labelled(std::string_view label, const Moment& what);
  /// The pieces joined.
  std::string text() const;

 private:
  std::array<std::string_view, 4> pieces_{};
  std::size_t count_ = 0;
};

/// The allocator's books for allocations that are only described. A Bytes handle is
/// shared like a Tensor and gives its bytes back when its last copy goes. Handles must not
/// outlive their ledger.
class MemoryLedger {
 public:
  struct Entry;
  /// A handle to one described allocation; the bytes are released with its last copy.
  using Bytes = std::shared_ptr<const Entry>;

  MemoryLedger() = default;
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  /// `bytes` of `category` from now until the handle's last copy goes (0 bytes: a null
  /// handle, as the allocator returns nullptr). `moment` says what is allocated, e.g.
  /// "micro-batch 1, block 3 backward: fc2's input gradient"; kept when it sets the peak.
  Bytes allocate(MemoryCategory category, std::size_t bytes, const Moment& moment);
  /// What TrackingAllocator::stats() would report.
  const MemoryStats& stats() const { return stats_; }
  /// The allocation at which the total last rose to its peak ("" while nothing has).
  const std::string& peak_moment() const { return peak_moment_; }
  /// As TrackingAllocator::reset_peak(): peaks become what is live now.
  void reset_peak(const std::string& moment);

 private:
  template <class T>
  friend class EntryAllocator;
  void release(MemoryCategory category, std::size_t bytes);
  void* take_node(std::size_t bytes);
  void give_node(void* node);
  MemoryStats stats_;
  std::string peak_moment_;
  // The handles' storage (an Entry with its shared count, one size): a prediction makes
  // and drops thousands of handles, and a heap allocation each was a third of its time
  // (two fifths under AddressSanitizer). Nodes are recycled through `free_`, carved from
  // chunks that live as long as the ledger.
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
  std::size_t node_bytes_ = 0, chunk_nodes_ = 0, carved_ = 0;
  void* free_ = nullptr;
};

/// What one block keeps for its backward, in bytes (BlockActivations' tensors).
struct BlockBytes {
  /// \var input
  /// The block's input h.
  /// \var normed
  /// ln(h); null under BlockKeep::gemm_outputs.
  /// \var mean
  /// ln's mean.
  /// \var rstd
  /// ln's 1 / sqrt(var + eps).
  /// \var pre_activation
  /// fc1's output.
  /// \var hidden
  /// fc2's input, the activation after dropout; null under BlockKeep::gemm_outputs.
  MemoryLedger::Bytes input, normed, mean, rstd, pre_activation, hidden;
};

/// The model's allocations replayed on a ledger, for one forward and backward of `rows`
/// samples at a time: Model::block_forward, Model::block_backward, and a copy as chapter
/// 05's checkpoints make. `label` prefixes every moment ("micro-batch 2").
class ModelLedger {
 public:
  /// A model of `config` replayed on `ledger`, which must outlive it. released_gradients:
  /// the model's gradients are released after every backward (Model::release_gradients,
  /// ZeRO stage 2), so each group's backward allocates its gradients again, live until the
  /// group is done (gradients_done); otherwise they live through the step and are not
  /// replayed here. bucket_bytes: HeldElements::gradient_bucket_bytes.
  ModelLedger(const ModelConfig& config, MemoryLedger& ledger, bool released_gradients = false,
              std::size_t bucket_bytes = 0);
  /// Sets the rows of the following allocations and the label that prefixes their moments.
  void start_micro_batch(std::int64_t rows, std::string label);

  /// Model::block_forward of block `index` from h (recompute: a second run in the step,
  /// named so in the moment).
  MemoryLedger::Bytes block_forward(std::int64_t index, MemoryLedger::Bytes h, BlockBytes& saved,
                                    BlockKeep keep, bool recompute);
  /// Model::block_backward: returns d_input (the gradient of the block's output stays the
  /// caller's, held throughout, so it is not an argument here).
  MemoryLedger::Bytes block_backward(std::int64_t index, const BlockBytes& saved);
  /// Under released gradients, `elements` f32 of MemoryCategory::gradients that a
  /// backward allocates for a group of parameters (`what` names it); else nothing (null).
  MemoryLedger::Bytes gradients(std::int64_t elements, const Moment& what);
  /// The backward has finished a group's `gradients` (from gradients()): released now or,
  /// with buckets, once the bucket after its own is full or the backward ends (`last`: the
  /// stem's group, the backward's last).
  void gradients_done(MemoryLedger::Bytes gradients, bool last);
  /// A copy of a hidden state h_i into MemoryCategory::checkpoints.
  MemoryLedger::Bytes checkpoint(std::int64_t state);

  /// `bytes` of MemoryCategory::activations in this micro-batch; `what` names the moment.
  MemoryLedger::Bytes activation(std::size_t bytes, const Moment& what);
  /// `bytes` of MemoryCategory::workspace in this micro-batch; `what` names the moment.
  MemoryLedger::Bytes workspace(std::size_t bytes, const Moment& what);

  /// The configuration being replayed.
  const ModelConfig& config() const { return config_; }
  std::size_t hidden_state_bytes() const;  ///< one [rows, H] activation
  std::size_t statistics_bytes() const;    ///< one of a norm's mean and rstd (f32)

 private:
  Moment moment(const Moment& what) const { return Moment::labelled(label_, what); }

  ModelConfig config_;
  MemoryLedger& ledger_;
  bool released_gradients_ = false;
  std::size_t bucket_bytes_ = 0;
  std::vector<MemoryLedger::Bytes> open_, in_flight_;  // with buckets: groups not released
  std::size_t open_bytes_ = 0;
  std::int64_t rows_ = 0;
  std::string label_;
};

/// The memory side of a block runner (nn::BlockRunnerFor): replays the runner's order of
/// block forwards, backwards and copies on a model's ledger (ModelLedger for the MLP,
/// GptLedger for the GPT); forward returns h_n, backward dh_0.
template <class Ledger>
class BlockLedgerRunnerFor {
 public:
  virtual ~BlockLedgerRunnerFor() = default;
  /// Replays the runner's forward of every block from h0 (the first block's input);
  /// returns h_n.
  virtual MemoryLedger::Bytes forward(Ledger& model, MemoryLedger::Bytes h0) = 0;
  /// Replays its backward from dh_n, releasing what forward kept; returns dh_0.
  virtual MemoryLedger::Bytes backward(Ledger& model, MemoryLedger::Bytes dh_n) = 0;
  /// Block forwards replayed so far.
  virtual std::int64_t evaluations() const = 0;
};

/// The MLP's.
using BlockLedgerRunner = BlockLedgerRunnerFor<ModelLedger>;

/// What one transformer block keeps for its backward, in bytes (GptBlockActivations'
/// tensors, the same names).
struct GptBlockBytes {
  MemoryLedger::Bytes input;  ///< x entering the block (the previous block's output)
  MemoryLedger::Bytes ln_1_out;       ///< ln_1(x)
  MemoryLedger::Bytes ln_1_mean;      ///< ln_1's means (f32)
  MemoryLedger::Bytes ln_1_rstd;      ///< ln_1's 1 / sqrt(var + eps) (f32)
  MemoryLedger::Bytes qkv;            ///< c_attn's output
  MemoryLedger::Bytes attention;      ///< the heads' output
  MemoryLedger::Bytes probabilities;  ///< plain attention's P [b, heads, T, T]
  MemoryLedger::Bytes row_stats;      ///< efficient attention's (m, l) [b, heads, T, 2] f32
  MemoryLedger::Bytes middle;         ///< x after the attention's residual
  MemoryLedger::Bytes ln_2_out;       ///< ln_2(middle)
  MemoryLedger::Bytes ln_2_mean;      ///< ln_2's means (f32)
  MemoryLedger::Bytes ln_2_rstd;      ///< ln_2's 1 / sqrt(var + eps) (f32)
  MemoryLedger::Bytes fc;             ///< c_fc's output
  MemoryLedger::Bytes gelu;           ///< gelu(fc), mlp.c_proj's input
};

/// The GPT's allocations replayed on a ledger (nn/gpt.cpp's order): Gpt::block_forward,
/// Gpt::block_backward, and a copy as chapter 05's checkpoints make, for b sequences of T
/// positions at a time.
class GptLedger {
 public:
  /// A GPT of `config` replayed on `ledger`, which must outlive it.
  GptLedger(const GptConfig& config, MemoryLedger& ledger);
  /// Sets the sequences and positions of the following allocations and the label that
  /// prefixes their moments ("micro-batch 2").
  void start_micro_batch(std::int64_t sequences, std::int64_t length, std::string label);

  /// Gpt::block_forward of block `index` from h (recompute: named so in the moments; keep:
  /// BlockKeep::all or all_but_probabilities, which drops P after the attention).
  MemoryLedger::Bytes block_forward(std::int64_t index, MemoryLedger::Bytes h,
                                    GptBlockBytes& saved, BlockKeep keep, bool recompute);
  /// Gpt::block_backward: returns d_input (the gradient of the block's output stays the
  /// caller's, held throughout); rebuilds P for the attention's backward when `saved` has
  /// none.
  MemoryLedger::Bytes block_backward(std::int64_t index, const GptBlockBytes& saved);
  /// A copy of a block input into MemoryCategory::checkpoints.
  MemoryLedger::Bytes checkpoint(std::int64_t state);

  /// `bytes` of MemoryCategory::activations in this micro-batch; `what` names the moment.
  MemoryLedger::Bytes activation(std::size_t bytes, const Moment& what);
  /// `bytes` of MemoryCategory::workspace in this micro-batch; `what` names the moment.
  MemoryLedger::Bytes workspace(std::size_t bytes, const Moment& what);
  /// n C elements of the activations' dtype: one [b, T, C] state.
  std::size_t state_bytes(std::int64_t channels_per_position = 1) const;
  /// A LayerNorm's mean or rstd over the n rows (f32).
  std::size_t statistics_bytes() const;
  /// The attention's probabilities P [b, heads, T, T] in the activations' dtype.
  std::size_t scores_bytes() const;
  /// One f32 for each of the attention's query rows, [b, heads, T]: the backward's row sums
  /// (r or D), and half of efficient attention's row statistics.
  std::size_t attention_rows_bytes() const;

 private:
  Moment moment(const Moment& what) const { return Moment::labelled(label_, what); }

  GptConfig config_;
  MemoryLedger& ledger_;
  std::int64_t sequences_ = 0, length_ = 0;
  std::string label_;
};

/// The GPT's.
using GptBlockLedgerRunner = BlockLedgerRunnerFor<GptLedger>;

/// One step's prediction: accumulate_gradients over a batch of `batch` rows on the host, in
/// micro-batches of `micro_batch`, each copied into an nn::MicroBatchBuffer of
/// min(micro_batch, batch) rows (x f32 and labels i32, MemoryCategory::data) before its
/// forward pass, with the parameters, their gradients and the optimizer's state live.
struct StepPrediction {
  MemoryStats stats;          ///< as the allocator reports it after the step, its peak
                              ///< reset just before accumulate_gradients
  std::string peak_moment;    ///< the allocation at which the total peaked
  std::int64_t block_forwards = 0;  ///< block forward evaluations, all micro-batches
  /// The step's peak total in bytes, stats.peak_total.
  std::size_t peak() const { return stats.peak_total; }
};

/// What a step holds only a part of, as element counts: a rank's shards under chapter
/// 07's ZeRO. -1 is the whole, as one process holds it.
struct HeldElements {
  /// The parameter elements the optimizer holds state for (stages 1 and 2).
  std::int64_t optimizer_state = -1;
  /// The gradient elements held through the step (stage 2). A part means that the model's
  /// own gradients live only from each group's backward to its sum over ranks
  /// (ModelLedger's released gradients).
  std::int64_t gradients = -1;
  /// The f32 master elements of the Linear weights held under mixed precision (stages 1
  /// and 2: the model keeps only the 16-bit working copies whole); fp32 has no masters.
  std::int64_t master_weights = -1;
  /// With gradients held in part (stage 2): 0, each group of the model's gradients is
  /// released as soon as the backward finishes it (its sum taken at once); else the groups
  /// are summed in buckets of at least this many bytes, overlapping the backward, and a
  /// bucket's groups are released when the next bucket is full (its sum having run
  /// meanwhile) or the backward ends.
  std::size_t gradient_bucket_bytes = 0;
};

/// Replays the step. runner: nullptr for the model's own order (every block's activations
/// kept), else the replay of the BlockRunner the model runs with. held_workspace: bytes of
/// MemoryCategory::workspace that the caller keeps on the device through every step, live
/// before it like the parameters (an optimizer boundary's results, chapter 04: 12 bytes
/// with a loss scale or clipping). held: the optimizer state, gradients and masters the
/// step holds when a part of them (a rank's shards under ZeRO).
StepPrediction predict_step(const ModelConfig& config, std::int64_t batch,
                            std::int64_t micro_batch, const Optimizer::Options& optimizer,
                            BlockLedgerRunner* runner = nullptr, std::size_t held_workspace = 0,
                            const HeldElements& held = {});

/// The same for chapter 08's GPT: a batch of `batch` sequences of `length` positions in
/// micro-batches of `micro_batch` sequences (the trainer's nn::MicroBatchBuffer: tokens and
/// targets, i32, MemoryCategory::data), the parameters with their f32 masters under mixed
/// precision, the gradients and the tied head's own gradient buffer, the optimizer's state
/// and `held_workspace` live before it. runner: nullptr for every block's activations kept,
/// else the replay of the block runner the GPT runs with.
StepPrediction predict_gpt_step(const GptConfig& config, std::int64_t batch,
                                std::int64_t micro_batch, std::int64_t length,
                                const Optimizer::Options& optimizer,
                                GptBlockLedgerRunner* runner = nullptr,
                                std::size_t held_workspace = 0);

}  // namespace bigbatch::nn
