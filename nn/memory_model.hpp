// memory_model.hpp: the bytes a training step of the model needs, predicted from its
// configuration alone, category by category (common/memory.hpp). Tests and chapter demos
// hold these predictions against the tracking allocator's counts, to the byte.
//
// predict_memory: the totals, as formulas (parameters, master_weights, gradients,
// adamw_state, and the activations forward() saves for `rows` samples, at their peak).
// predict_step: the whole step, moment by moment, replayed on a MemoryLedger: every tensor
// forward(), the loss and backward() allocate, of the same size and category, created and
// released at the same moments as in the model and nn/training.cpp. The ledger keeps the
// allocator's books (MemoryStats) and names the allocation at which the total peaked. A
// model brings its part as a NetworkLedger (ModelLedger, GptLedger); a driver that runs the
// blocks in its own order replays that order through a BlockLedgerRunner.
//
// Why and how: docs/internals.md#nnmemory_modelhpp
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

/// What one block keeps for its backward, in bytes: a handle for each tensor it saves, in
/// the order its model's ledger numbers them (nn/memory_model.cpp: mlp_kept, gpt_kept),
/// null where the block keeps none.
struct BlockBytes {
  /// The most tensors a block of any model saves (the GPT's block: 14).
  static constexpr std::size_t kMaxKept = 16;
  /// The handles, by the model's numbering.
  std::array<MemoryLedger::Bytes, kMaxKept> kept{};
};

/// What a model holds through a step whatever its batch, and what one sample of the
/// micro-batch buffer takes.
struct ModelBytes {
  /// \var parameters
  /// MemoryCategory::parameters: the working copies, and BatchNorm's running statistics.
  /// \var master_weights
  /// MemoryCategory::master_weights: the f32 masters under fp16 or bf16, else 0.
  /// \var gradients
  /// MemoryCategory::gradients held through the step (the GPT's tied head adds a buffer).
  std::size_t parameters = 0, master_weights = 0, gradients = 0;
  /// \var trainable
  /// Elements with a gradient and an optimizer state.
  /// \var master_elements
  /// Elements of the tensors with an f32 master under mixed precision.
  std::int64_t trainable = 0, master_elements = 0;
  /// \var sample
  /// One sample's inputs in the buffer (MemoryCategory::data).
  /// \var labels
  /// One sample's targets in the buffer (MemoryCategory::data).
  std::size_t sample = 0, labels = 0;
};

/// A model's allocations replayed on a ledger, part by part in its own order: the stem, a
/// block's forward and backward (and a copy of a block's input as chapter 05's checkpoints
/// make), the head with the loss. A model brings these (ModelLedger for the MLP, GptLedger
/// for the GPT); predict_step and the block runners' replays (BlockLedgerRunner) run any of
/// them. One step at a time: predict_step starts each.
class NetworkLedger {
 public:
  virtual ~NetworkLedger() = default;

  /// What the model holds through a step.
  virtual ModelBytes held() const = 0;
  /// The element counts of its trainable tensors, one per parameter (in no particular
  /// order): what chapter 07's ZeRO shards tensor by tensor.
  virtual std::vector<std::int64_t> trainable_sizes() const = 0;
  /// The element counts of the tensors with an f32 master under mixed precision (whatever
  /// the precision).
  virtual std::vector<std::int64_t> master_weight_sizes() const = 0;
  /// Its blocks, the chain a BlockLedgerRunner runs.
  virtual std::int64_t depth() const = 0;
  /// Whether its blocks can keep what `keep` says (BlockKeep::all always).
  virtual bool keeps(BlockKeep keep) const = 0;
  /// Whether its backward tells each group of gradients as it finishes them, so that ZeRO
  /// stage 2 can release them (nn::Network::releases_state).
  virtual bool releases_state() const { return false; }

  /// The stem's forward in this micro-batch; returns h0, the first block's input. What the
  /// stem keeps for its backward is held until end_micro_batch.
  virtual MemoryLedger::Bytes stem_forward() = 0;
  /// Block `index`'s forward from h (recompute: a second run in the step, named so in the
  /// moments); fills `saved` with what `keep` keeps, returns its output.
  virtual MemoryLedger::Bytes block_forward(std::int64_t index, MemoryLedger::Bytes h,
                                            BlockBytes& saved, BlockKeep keep,
                                            bool recompute) = 0;
  /// The head's forward from h_n, the loss, the head's backward; returns dh_n. The logits
  /// and their gradient are held until end_micro_batch.
  virtual MemoryLedger::Bytes head(MemoryLedger::Bytes h_n) = 0;
  /// Block `index`'s backward: returns d_input (the gradient of the block's output stays the
  /// caller's, held throughout, so it is not an argument here).
  virtual MemoryLedger::Bytes block_backward(std::int64_t index, const BlockBytes& saved) = 0;
  /// The stem's backward, the micro-batch's last part (the MLP's allocates only its
  /// gradients, when they are released; the GPT's scatter-add none).
  virtual void stem_backward() {}
  /// One block input of this micro-batch (a checkpoint's bytes).
  virtual std::size_t state_bytes() const = 0;

  /// Starts a step on `ledger`, which must outlive it. released_gradients: the model's
  /// gradients are released after each group's backward (ZeRO stage 2; releases_state()
  /// must hold), so gradients() allocates them again, live until the group is done;
  /// otherwise they live through the step and gradients() allocates nothing. bucket_bytes:
  /// HeldElements::gradient_bucket_bytes.
  void start_step(MemoryLedger& ledger, bool released_gradients, std::size_t bucket_bytes);
  /// Sets the samples of the following allocations (the MLP's rows, the GPT's sequences)
  /// and the label that prefixes their moments ("micro-batch 2").
  void start_micro_batch(std::int64_t samples, std::string label);
  /// Releases what the stem and the head held through the micro-batch.
  void end_micro_batch() { held_.clear(); }
  /// A copy of block input h_`state` into MemoryCategory::checkpoints.
  MemoryLedger::Bytes checkpoint(std::int64_t state);

  /// `bytes` of MemoryCategory::activations in this micro-batch; `what` names the moment.
  MemoryLedger::Bytes activation(std::size_t bytes, const Moment& what);
  /// `bytes` of MemoryCategory::workspace in this micro-batch; `what` names the moment.
  MemoryLedger::Bytes workspace(std::size_t bytes, const Moment& what);
  /// Under released gradients, `elements` f32 of MemoryCategory::gradients that a
  /// backward allocates for a group of parameters (`what` names it); else nothing (null).
  MemoryLedger::Bytes gradients(std::int64_t elements, const Moment& what);
  /// The backward has finished a group's `gradients` (from gradients()): released now or,
  /// with buckets, once the bucket after its own is full or the backward ends (`last`: the
  /// backward's last group).
  void gradients_done(MemoryLedger::Bytes gradients, bool last);

 protected:
  /// The samples of this micro-batch.
  std::int64_t samples() const { return samples_; }
  /// Keeps `bytes` live until end_micro_batch.
  void hold(MemoryLedger::Bytes bytes) { held_.push_back(std::move(bytes)); }

 private:
  Moment moment(const Moment& what) const { return Moment::labelled(label_, what); }

  MemoryLedger* ledger_ = nullptr;
  bool released_gradients_ = false;
  std::size_t bucket_bytes_ = 0;
  std::vector<MemoryLedger::Bytes> open_, in_flight_;  // with buckets: groups not released
  std::size_t open_bytes_ = 0;
  std::vector<MemoryLedger::Bytes> held_;
  std::int64_t samples_ = 0;
  std::string label_;
};

/// The residual MLP's replay (nn/model.cpp's order): a micro-batch of b rows.
class ModelLedger final : public NetworkLedger {
 public:
  /// The MLP of `config`.
  explicit ModelLedger(const ModelConfig& config) : config_(config) {}
  ModelBytes held() const override;
  std::vector<std::int64_t> trainable_sizes() const override;
  std::vector<std::int64_t> master_weight_sizes() const override;
  std::int64_t depth() const override { return config_.depth; }
  /// BlockKeep::all or gemm_outputs (selective recomputation).
  bool keeps(BlockKeep keep) const override { return Model::keeps(keep); }
  bool releases_state() const override { return true; }
  MemoryLedger::Bytes stem_forward() override;
  MemoryLedger::Bytes block_forward(std::int64_t index, MemoryLedger::Bytes h, BlockBytes& saved,
                                    BlockKeep keep, bool recompute) override;
  MemoryLedger::Bytes head(MemoryLedger::Bytes h_n) override;
  MemoryLedger::Bytes block_backward(std::int64_t index, const BlockBytes& saved) override;
  void stem_backward() override;
  std::size_t state_bytes() const override;  ///< one [rows, H] activation

 private:
  std::size_t statistics_bytes() const;  // one of a norm's mean and rstd (f32)
  ModelConfig config_;
};

/// The GPT's replay (nn/gpt.cpp's order): a micro-batch of b sequences of `length`
/// positions.
class GptLedger final : public NetworkLedger {
 public:
  /// A GPT of `config` on sequences of `length` positions (1..config.context, else
  /// std::invalid_argument).
  GptLedger(const GptConfig& config, std::int64_t length);
  ModelBytes held() const override;
  /// wte, wpe, each block's, ln_f's (gpt_parameter_count's terms).
  std::vector<std::int64_t> trainable_sizes() const override;
  /// wte, wpe and each block's four Linear weights.
  std::vector<std::int64_t> master_weight_sizes() const override;
  std::int64_t depth() const override { return config_.layers; }
  /// BlockKeep::all, or all_but_probabilities under plain attention: P dropped after the
  /// attention and rebuilt in the backward.
  bool keeps(BlockKeep keep) const override;
  MemoryLedger::Bytes stem_forward() override;
  MemoryLedger::Bytes block_forward(std::int64_t index, MemoryLedger::Bytes h, BlockBytes& saved,
                                    BlockKeep keep, bool recompute) override;
  MemoryLedger::Bytes head(MemoryLedger::Bytes h_n) override;
  /// Rebuilds P for the attention's backward when `saved` has none.
  MemoryLedger::Bytes block_backward(std::int64_t index, const BlockBytes& saved) override;
  std::size_t state_bytes() const override { return states_bytes(1); }

 private:
  std::size_t states_bytes(std::int64_t channels_per_position) const;  // n C of the dtype
  std::size_t statistics_bytes() const;      // a LayerNorm's mean or rstd, f32 per position
  std::size_t scores_bytes() const;          // P [b, heads, T, T] in the activations' dtype
  std::size_t attention_rows_bytes() const;  // f32 per query row, [b, heads, T]
  GptConfig config_;
  std::int64_t length_ = 0;
};

/// The memory side of a block runner (nn::BlockRunnerFor): replays the runner's order of
/// block forwards, backwards and copies on any model's ledger; forward returns h_n,
/// backward dh_0.
class BlockLedgerRunner {
 public:
  virtual ~BlockLedgerRunner() = default;
  /// Replays the runner's forward of every block from h0 (the first block's input);
  /// returns h_n.
  virtual MemoryLedger::Bytes forward(NetworkLedger& model, MemoryLedger::Bytes h0) = 0;
  /// Replays its backward from dh_n, releasing what forward kept; returns dh_0.
  virtual MemoryLedger::Bytes backward(NetworkLedger& model, MemoryLedger::Bytes dh_n) = 0;
  /// Block forwards replayed so far.
  virtual std::int64_t evaluations() const = 0;
};

/// One step's prediction: accumulate_gradients over a batch of `batch` samples on the host,
/// in micro-batches of `micro_batch`, each copied into an nn::MicroBatchBuffer of
/// min(micro_batch, batch) samples (MemoryCategory::data) before its forward pass, with the
/// parameters, their gradients and the optimizer's state live.
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
  /// (NetworkLedger's released gradients).
  std::int64_t gradients = -1;
  /// The f32 master elements held under mixed precision (stages 1 and 2: the model keeps
  /// only the 16-bit working copies whole); fp32 has no masters.
  std::int64_t master_weights = -1;
  /// With gradients held in part (stage 2): 0, each group of the model's gradients is
  /// released as soon as the backward finishes it (its sum taken at once); else the groups
  /// are summed in buckets of at least this many bytes, overlapping the backward, and a
  /// bucket's groups are released when the next bucket is full (its sum having run
  /// meanwhile) or the backward ends.
  std::size_t gradient_bucket_bytes = 0;
};

/// Replays a step of `model` (any model's ledger: ModelLedger, GptLedger). runner: nullptr
/// for the model's own order (every block's activations kept), else the replay of the
/// BlockRunner the model runs with. held_workspace: bytes of MemoryCategory::workspace that
/// the caller keeps on the device through every step, live before it like the parameters
/// (an optimizer boundary's results, chapter 04: 12 bytes with a loss scale or clipping).
/// held: the optimizer state, gradients and masters the step holds when a part of them (a
/// rank's shards under ZeRO; gradients in part need model.releases_state()).
StepPrediction predict_step(NetworkLedger& model, std::int64_t batch, std::int64_t micro_batch,
                            const Optimizer::Options& optimizer,
                            BlockLedgerRunner* runner = nullptr, std::size_t held_workspace = 0,
                            const HeldElements& held = {});
/// The same for a ledger made in the call: predict_step(nn::ModelLedger(config), ...).
inline StepPrediction predict_step(NetworkLedger&& model, std::int64_t batch,
                                   std::int64_t micro_batch, const Optimizer::Options& optimizer,
                                   BlockLedgerRunner* runner = nullptr,
                                   std::size_t held_workspace = 0,
                                   const HeldElements& held = {}) {
  return predict_step(model, batch, micro_batch, optimizer, runner, held_workspace, held);
}

}  // namespace bigbatch::nn
