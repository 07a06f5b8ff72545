// memory_model.cpp: the byte counts of memory_model.hpp. predict_step follows the
// allocations of nn/model.cpp and nn/training.cpp in their order; a change there that
// allocates more, less or at another moment shows up in tests/test_memory_model.cpp.
#include "nn/memory_model.hpp"

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <utility>

#include "common/check.hpp"
#include "common/integer_math.hpp"

namespace bigbatch::nn {
namespace {

using Bytes = MemoryLedger::Bytes;

std::size_t to_size(std::int64_t n) { return static_cast<std::size_t>(n); }

/// The model's own tensors, both norms: (parameters, master weights, gradients) bytes.
struct StaticBytes {
  std::size_t parameters = 0, master_weights = 0, gradients = 0, trainable = 0;
};

/// The Linear weights' element counts (stem, each block's fc1 and fc2, head), and the rest:
/// the Linear biases (stem, fc1, fc2, head) and the norms' weight and bias (blocks, head).
struct TrainableTensors {
  std::vector<std::int64_t> weights, others;
};

TrainableTensors trainable_tensors(const ModelConfig& c) {
  const std::int64_t d = c.inputs, h = c.hidden, inner = c.expansion * c.hidden, k = c.classes;
  TrainableTensors t;
  t.weights = {d * h, h * k};
  t.others = {h, k, h, h};  // stem and head biases, the head norm's weight and bias
  for (std::int64_t b = 0; b < c.depth; ++b) {
    t.weights.insert(t.weights.end(), {h * inner, inner * h});
    t.others.insert(t.others.end(), {h, h, inner, h});  // norm weight and bias, fc biases
  }
  return t;
}

std::int64_t sum(const std::vector<std::int64_t>& counts) {
  std::int64_t total = 0;
  for (const std::int64_t n : counts) total += n;
  return total;
}

StaticBytes static_bytes(const ModelConfig& c) {
  const bool mixed = is_mixed(c.precision);  // fp16 and bf16: the same bytes
  const std::int64_t h = c.hidden;
  const TrainableTensors tensors = trainable_tensors(c);
  const std::int64_t weights = sum(tensors.weights), others = sum(tensors.others);
  // BatchNorm's running mean and variance, per norm layer (blocks and head): parameters.
  const std::int64_t running = c.norm == Norm::batch ? (c.depth + 1) * 2 * h : 0;
  StaticBytes s;
  s.trainable = to_size(weights + others);
  s.parameters = to_size((mixed ? 2 * weights + 4 * others : 4 * (weights + others)) + 4 * running);
  s.master_weights = to_size(mixed ? 4 * weights : 0);
  s.gradients = 4 * s.trainable;
  return s;
}

}  // namespace

std::vector<std::int64_t> trainable_sizes(const ModelConfig& config) {
  TrainableTensors tensors = trainable_tensors(config);
  tensors.weights.insert(tensors.weights.end(), tensors.others.begin(), tensors.others.end());
  return tensors.weights;
}

std::vector<std::int64_t> master_weight_sizes(const ModelConfig& config) {
  return trainable_tensors(config).weights;
}

PredictedBytes predict_memory(const ModelConfig& c, std::int64_t rows) {
  BIGBATCH_CHECK(c.norm == Norm::layer, "predict_memory: only LayerNorm models are modelled");
  BIGBATCH_CHECK(rows >= 0, "predict_memory: rows must be >= 0, got ", rows);
  const bool mixed = is_mixed(c.precision);  // fp16 and bf16: the same bytes
  const std::int64_t d = c.inputs, h = c.hidden, inner = c.expansion * c.hidden, k = c.classes;
  const StaticBytes fixed = static_bytes(c);
  PredictedBytes p;
  p.parameters = fixed.parameters;
  p.master_weights = fixed.master_weights;
  p.gradients = fixed.gradients;
  p.adamw_state = 2 * p.gradients;
  const std::int64_t s = mixed ? 2 : 4;
  const std::int64_t per_sample = 2 * h * s + c.depth * ((2 * h + 2 * inner) * s + 8) +
                                  h * s + 8 + 4 * k + (mixed ? 2 * d : 0);
  p.activations = to_size(rows * per_sample);
  return p;
}

namespace {

/// One term of a count: the product of its factors (each >= 0).
using Product = std::initializer_list<std::int64_t>;

constexpr std::size_t kTooMany = std::numeric_limits<std::size_t>::max();

std::size_t saturating_add(std::size_t a, std::size_t b) {
  std::size_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? kTooMany : sum;
}

std::size_t saturating_product(Product factors, std::size_t times) {
  std::size_t product = times;
  for (const std::int64_t factor : factors) {
    if (__builtin_mul_overflow(product, to_size(factor), &product)) return kTooMany;
  }
  return product;
}

/// The parameters' bytes of the Linear weights `weights` (2 bytes each under mixed
/// precision, else 4) and the f32 elements `others`, each the sum of its terms.
std::size_t parameter_bytes_of(Precision precision, std::initializer_list<Product> weights,
                               std::initializer_list<Product> others) {
  std::size_t total = 0;
  for (const Product& term : weights) {
    total = saturating_add(total, saturating_product(term, is_mixed(precision) ? 2 : 4));
  }
  for (const Product& term : others) total = saturating_add(total, saturating_product(term, 4));
  return total;
}

}  // namespace

std::size_t parameter_bytes(const ModelConfig& c) {
  const std::int64_t d = c.inputs, h = c.hidden, e = c.expansion, k = c.classes, n = c.depth;
  // trainable_tensors' lists summed: the stem's and head's weights, each block's fc1 and fc2
  // (h x eh each); the stem's and head's biases and the head norm's weight and bias, each
  // block's norm weight and bias and fc2 bias (3h) and fc1 bias (eh). BatchNorm's running
  // mean and variance (2h) per norm layer, the blocks' and the head's.
  const bool batch = c.norm == Norm::batch;
  return parameter_bytes_of(c.precision, {{d, h}, {h, k}, {n, 2, e, h, h}},
                            {{3, h}, {k}, {n, 3, h}, {n, e, h}, {batch ? n + 1 : 0, 2, h}});
}

std::size_t parameter_bytes(const GptConfig& c) {
  const std::int64_t V = c.vocabulary, T = c.context, N = c.layers, C = c.width;
  // wte, wpe and each block's four Linear weights (12 C^2); each block's biases and norms
  // (13 C) and ln_f (2 C), as gpt_parameter_count.
  return parameter_bytes_of(c.precision, {{V, C}, {T, C}, {N, 12, C, C}}, {{N, 13, C}, {2, C}});
}

std::size_t optimizer_state_bytes_per_parameter(const Optimizer::Options& options) {
  if (const auto* sgd = std::get_if<SgdOptions>(&options)) return sgd->momentum != 0 ? 4 : 0;
  return 8;
}

// ---- the ledger ---------------------------------------------------------------------------

Moment Moment::labelled(std::string_view label, const Moment& what) {
  BIGBATCH_CHECK(what.count_ <= 2, "Moment: at most two pieces after a label");
  Moment joined(label, ", ");
  for (std::size_t i = 0; i < what.count_; ++i) joined.pieces_[joined.count_++] = what.pieces_[i];
  return joined;
}

std::string Moment::text() const {
  std::string joined;
  for (std::size_t i = 0; i < count_; ++i) joined += pieces_[i];
  return joined;
}

/// The allocator of the handles (std::allocate_shared): the ledger's nodes.
template <class T>
class EntryAllocator {
 public:
  using value_type = T;
  explicit EntryAllocator(MemoryLedger* ledger) : ledger_(ledger) {}
  template <class U>
  EntryAllocator(const EntryAllocator<U>& other) : ledger_(other.ledger_) {}  // NOLINT
  T* allocate(std::size_t n) {
    BIGBATCH_CHECK(n == 1, "EntryAllocator: one node at a time");
    return static_cast<T*>(ledger_->take_node(sizeof(T)));
  }
  void deallocate(T* node, std::size_t) { ledger_->give_node(node); }
  template <class U>
  bool operator==(const EntryAllocator<U>& other) const { return ledger_ == other.ledger_; }

 private:
  template <class U>
  friend class EntryAllocator;
  MemoryLedger* ledger_;
};

struct MemoryLedger::Entry {
  Entry(MemoryLedger* ledger, MemoryCategory category, std::size_t bytes)
      : ledger(ledger), category(category), bytes(bytes) {}
  Entry(const Entry&) = delete;  // one Entry per allocation: its destructor gives it back
  Entry& operator=(const Entry&) = delete;
  ~Entry() { ledger->release(category, bytes); }
  MemoryLedger* ledger;
  MemoryCategory category;
  std::size_t bytes;
};

Bytes MemoryLedger::allocate(MemoryCategory category, std::size_t bytes,
                             const Moment& moment) {
  if (bytes == 0) return nullptr;
  // The allocator's rules (common/memory.cpp): per-category peaks, and the breakdown when
  // the device total rises above its peak; host_data stays out of the totals.
  const auto c = static_cast<std::size_t>(category);
  stats_.live[c] += bytes;
  stats_.allocation_count += 1;
  stats_.peak[c] = std::max(stats_.peak[c], stats_.live[c]);
  if (counts_on_device(category)) {
    stats_.live_total += bytes;
    if (stats_.live_total > stats_.peak_total) {
      stats_.peak_total = stats_.live_total;
      stats_.at_peak = stats_.live;
      peak_moment_ = moment.text();
    }
  }
  return std::allocate_shared<const Entry>(EntryAllocator<Entry>(this), this, category, bytes);
}

void* MemoryLedger::take_node(std::size_t bytes) {
  if (free_ != nullptr) {
    void* node = free_;
    free_ = *static_cast<void**>(node);
    return node;
  }
  // One size only (shared_ptr's block holding an Entry), rounded up to keep nodes aligned;
  // chunks of 32 nodes, then twice the last (most ledgers hold a few hundred at most).
  constexpr std::size_t align = alignof(std::max_align_t);
  bytes = round_up(bytes, align);
  BIGBATCH_CHECK(node_bytes_ == 0 || bytes == node_bytes_, "MemoryLedger: nodes of one size");
  node_bytes_ = bytes;
  if (chunks_.empty() || carved_ == chunk_nodes_) {
    chunk_nodes_ = chunks_.empty() ? 32 : 2 * chunk_nodes_;
    chunks_.push_back(std::make_unique_for_overwrite<std::byte[]>(chunk_nodes_ * bytes));
    carved_ = 0;
  }
  return chunks_.back().get() + bytes * carved_++;
}

void MemoryLedger::give_node(void* node) {
  *static_cast<void**>(node) = free_;
  free_ = node;
}

void MemoryLedger::release(MemoryCategory category, std::size_t bytes) {
  stats_.live[static_cast<std::size_t>(category)] -= bytes;
  if (counts_on_device(category)) stats_.live_total -= bytes;
}

void MemoryLedger::reset_peak(const std::string& moment) {
  stats_.peak = stats_.live;
  stats_.at_peak = stats_.live;
  stats_.peak_total = stats_.live_total;
  peak_moment_ = moment;
}

// ---- the model ----------------------------------------------------------------------------

ModelLedger::ModelLedger(const ModelConfig& config, MemoryLedger& ledger,
                         bool released_gradients, std::size_t bucket_bytes)
    : config_(config), ledger_(ledger), released_gradients_(released_gradients),
      bucket_bytes_(bucket_bytes) {}

Bytes ModelLedger::gradients(std::int64_t elements, const Moment& what) {
  if (!released_gradients_) return nullptr;
  return ledger_.allocate(MemoryCategory::gradients, 4 * to_size(elements), moment(what));
}

void ModelLedger::gradients_done(Bytes gradients, bool last) {
  if (!released_gradients_ || bucket_bytes_ == 0) return;  // released as the handle goes
  open_bytes_ += gradients ? gradients->bytes : 0;
  open_.push_back(std::move(gradients));
  if (open_bytes_ >= bucket_bytes_ || last) {
    // The bucket in flight is waited for and released; the open one starts its sum.
    in_flight_ = std::exchange(open_, {});
    open_bytes_ = 0;
  }
  if (last) in_flight_.clear();  // the backward's end waits for every sum
}

void ModelLedger::start_micro_batch(std::int64_t rows, std::string label) {
  rows_ = rows;
  label_ = std::move(label);
}

std::size_t ModelLedger::hidden_state_bytes() const {
  return to_size(rows_ * config_.hidden) * dtype_size(working_dtype(config_.precision));
}

std::size_t ModelLedger::statistics_bytes() const {
  // f32 per row (LayerNorm) or per feature (BatchNorm in training).
  return 4 * to_size(config_.norm == Norm::layer ? rows_ : config_.hidden);
}

Bytes ModelLedger::activation(std::size_t bytes, const Moment& what) {
  return ledger_.allocate(MemoryCategory::activations, bytes, moment(what));
}

Bytes ModelLedger::workspace(std::size_t bytes, const Moment& what) {
  return ledger_.allocate(MemoryCategory::workspace, bytes, moment(what));
}

Bytes ModelLedger::checkpoint(std::int64_t state) {
  return ledger_.allocate(MemoryCategory::checkpoints, hidden_state_bytes(),
                          moment("store h" + std::to_string(state) + " as a checkpoint"));
}

Bytes ModelLedger::block_forward(std::int64_t index, Bytes h, BlockBytes& saved, BlockKeep keep,
                                 bool recompute) {
  BIGBATCH_CHECK(keep != BlockKeep::all_but_probabilities,
                 "ModelLedger: the MLP's block has no attention probabilities");
  const std::string block =
      "block " + std::to_string(index) + (recompute ? " forward (recomputed): " : " forward: ");
  const std::size_t state = hidden_state_bytes(), inner = state * to_size(config_.expansion);
  saved.input = std::move(h);
  saved.normed = activation(state, {block, "ln's output"});
  saved.mean = activation(statistics_bytes(), {block, "ln's mean"});
  saved.rstd = activation(statistics_bytes(), {block, "ln's rstd"});
  saved.pre_activation = activation(inner, {block, "fc1's output"});
  saved.hidden = activation(inner, {block, "the activation after dropout"});
  Bytes output = activation(state, {block, "the block's output"});
  if (keep == BlockKeep::gemm_outputs) saved.normed = saved.hidden = nullptr;
  return output;
}

Bytes ModelLedger::block_backward(std::int64_t index, const BlockBytes& saved) {
  const std::string block = "block " + std::to_string(index) + " backward: ";
  const std::size_t state = hidden_state_bytes(), inner = state * to_size(config_.expansion);
  const std::int64_t h = config_.hidden, e = config_.expansion * config_.hidden;
  // ln's weight and bias, fc1's and fc2's weight and bias.
  Bytes gradients_of_block =
      gradients(2 * h + (e * h + e) + (h * e + h), {block, "the block's gradients"});
  const Bytes d_hidden = workspace(inner, {block, "fc2's input gradient"});
  Bytes hidden = saved.hidden;
  if (!hidden) hidden = activation(inner, {block, "the activation after dropout, recomputed"});
  hidden = nullptr;
  Bytes normed = saved.normed;
  if (!normed) {
    normed = activation(state, {block, "ln's output, recomputed"});
    const Bytes mean = activation(statistics_bytes(), {block, "ln's mean, recomputed"});
    const Bytes rstd = activation(statistics_bytes(), {block, "ln's rstd, recomputed"});
  }
  const Bytes d_normed = workspace(state, {block, "fc1's input gradient"});
  normed = nullptr;
  Bytes d_input = workspace(state, {block, "the block's input gradient"});
  if (config_.norm == Norm::batch) {  // kernels/batchnorm: the batch means of dy, dy xhat
    workspace(8 * to_size(config_.hidden), {block, "BatchNorm's batch means"});
  }
  gradients_done(std::move(gradients_of_block), /*last=*/false);
  return d_input;
}

// ---- the step -----------------------------------------------------------------------------

namespace {

/// What is live before a step, in the order it is allocated: the model and its optimizer,
/// one micro-batch's buffer (nn::MicroBatchBuffer: the batch stays on the host), and the
/// workspace the caller keeps through every step.
struct BeforeStep {
  std::size_t parameters = 0, master_weights = 0, gradients = 0, optimizer_state = 0;
  std::size_t samples = 0, labels = 0;  ///< the buffer's two tensors (MemoryCategory::data)
  std::size_t held_workspace = 0;
};

/// Allocates `bytes` as live before the step and resets the peak there; the handles must
/// live until the prediction ends.
std::vector<Bytes> live_before_step(MemoryLedger& ledger, const BeforeStep& bytes) {
  const std::string before = "before the step";
  std::vector<Bytes> live = {
      ledger.allocate(MemoryCategory::parameters, bytes.parameters, before),
      ledger.allocate(MemoryCategory::master_weights, bytes.master_weights, before),
      ledger.allocate(MemoryCategory::gradients, bytes.gradients, before),
      ledger.allocate(MemoryCategory::optimizer_state, bytes.optimizer_state, before),
      ledger.allocate(MemoryCategory::data, bytes.samples, before),
      ledger.allocate(MemoryCategory::data, bytes.labels, before),
      ledger.allocate(MemoryCategory::workspace, bytes.held_workspace, before)};
  ledger.reset_peak(before);
  return live;
}

/// The samples the micro-batch buffer holds: one micro-batch's, or the batch's when smaller.
std::size_t staged_samples(std::int64_t batch, std::int64_t micro_batch) {
  return to_size(std::min(batch, micro_batch));
}

}  // namespace

StepPrediction predict_step(const ModelConfig& c, std::int64_t batch, std::int64_t micro_batch,
                            const Optimizer::Options& optimizer, BlockLedgerRunner* runner,
                            std::size_t held_workspace, const HeldElements& held) {
  BIGBATCH_CHECK(batch > 0 && micro_batch > 0, "predict_step: batch and micro_batch must be "
                 "positive, got ", batch, " and ", micro_batch);
  MemoryLedger ledger;
  const bool mixed = is_mixed(c.precision);  // fp16 and bf16: the same bytes
  const std::size_t h = to_size(c.hidden), d = to_size(c.inputs), k = to_size(c.classes);

  // Live before the step: the model, its optimizer, one micro-batch's samples and labels.
  const StaticBytes fixed = static_bytes(c);
  const auto trainable = static_cast<std::int64_t>(fixed.trainable);
  const auto in_range = [](std::int64_t part, std::int64_t whole) {
    return part >= -1 && part <= whole;
  };
  BIGBATCH_CHECK(in_range(held.optimizer_state, trainable) && in_range(held.gradients, trainable) &&
                     in_range(held.master_weights, sum(master_weight_sizes(c))),
                 "predict_step: held optimizer state ", held.optimizer_state, ", gradients ",
                 held.gradients, " of ", trainable, " trainable elements, master weights ",
                 held.master_weights, " of ", sum(master_weight_sizes(c)));
  const bool released_gradients = held.gradients >= 0;
  const std::size_t stepped =
      held.optimizer_state < 0 ? fixed.trainable : to_size(held.optimizer_state);
  const std::size_t staged = staged_samples(batch, micro_batch);
  const std::vector<Bytes> live = live_before_step(
      ledger,
      {.parameters = fixed.parameters,
       .master_weights = held.master_weights < 0 || !mixed ? fixed.master_weights
                                                           : 4 * to_size(held.master_weights),
       .gradients = released_gradients ? 4 * to_size(held.gradients) : fixed.gradients,
       .optimizer_state = stepped * optimizer_state_bytes_per_parameter(optimizer),
       .samples = 4 * staged * d,
       .labels = 4 * staged,
       .held_workspace = held_workspace});

  BIGBATCH_CHECK(held.gradient_bucket_bytes == 0 || released_gradients,
                 "predict_step: gradient buckets of ", held.gradient_bucket_bytes,
                 " bytes for gradients held whole");
  ModelLedger model(c, ledger, released_gradients, held.gradient_bucket_bytes);
  Bytes loss = ledger.allocate(MemoryCategory::workspace, 4, "the loss");
  std::int64_t micro_batches = 0;
  for (std::int64_t begin = 0; begin < batch; begin += micro_batch) {
    const std::size_t b = to_size(std::min(batch, begin + micro_batch) - begin);
    model.start_micro_batch(static_cast<std::int64_t>(b),
                            "micro-batch " + std::to_string(++micro_batches));
    const std::size_t hidden_state = model.hidden_state_bytes();
    const std::size_t statistics = model.statistics_bytes();

    // Model::forward: the stem.
    Bytes input;  // fp32 reads x itself
    if (mixed) input = model.activation(2 * b * d, "forward: the input in 16 bits");
    Bytes stem_pre_activation = model.activation(hidden_state, "forward: stem's output");
    Bytes hidden = model.activation(hidden_state, "forward: the stem's activation (h0)");
    // The blocks.
    std::vector<BlockBytes> blocks;
    if (runner) {
      hidden = runner->forward(model, std::move(hidden));
    } else {
      blocks.resize(to_size(c.depth));
      for (std::int64_t i = 0; i < c.depth; ++i) {
        hidden = model.block_forward(i, hidden, blocks[to_size(i)], BlockKeep::all, false);
      }
    }
    // The head: its norm, the logits (f32).
    Bytes head_input = std::move(hidden);
    Bytes head_normed = model.activation(hidden_state, "forward: head.ln's output");
    Bytes head_mean = model.activation(statistics, "forward: head.ln's mean");
    Bytes head_rstd = model.activation(statistics, "forward: head.ln's rstd");
    const Bytes logits = model.activation(4 * b * k, "forward: the logits");
    // The loss (kernels/cross_entropy: one loss per row), its gradient.
    model.workspace(4 * b, "the loss: per-row losses");
    const Bytes dlogits = model.workspace(4 * b * k, "the loss's gradient");

    // Model::backward: the head.
    Bytes head_gradients = model.gradients(2 * c.hidden + c.classes * c.hidden + c.classes,
                                           "backward: the head's gradients");
    Bytes d_head;  // fp32: dlogits itself
    if (mixed) d_head = model.workspace(2 * b * k, "backward: the logits' gradient in 16 bits");
    Bytes dh;
    {
      const Bytes d_normed = model.workspace(hidden_state, "backward: head.ln's output gradient");
      d_head = nullptr;
      dh = model.workspace(hidden_state, "backward: the head's input gradient");
      if (c.norm == Norm::batch) model.workspace(8 * h, "backward: head.ln's batch means");
    }
    model.gradients_done(std::move(head_gradients), /*last=*/false);  // summed over ranks
    head_input = head_normed = head_mean = head_rstd = nullptr;
    // The blocks, last first.
    if (runner) {
      dh = runner->backward(model, std::move(dh));
    } else {
      for (std::int64_t i = c.depth; i-- > 0;) {
        dh = model.block_backward(i, blocks[to_size(i)]);
        blocks[to_size(i)] = BlockBytes{};
      }
    }
    // The stem's backward works in place and allocates nothing but its gradients, when
    // they were released; the rest goes here.
    model.gradients_done(model.gradients(c.inputs * c.hidden + c.hidden,
                                         "backward: the stem's gradients"),
                         /*last=*/true);
  }
  loss = nullptr;  // read back and released as accumulate_gradients returns
  StepPrediction p;
  p.stats = ledger.stats();
  p.peak_moment = ledger.peak_moment();
  p.block_forwards = runner ? runner->evaluations() : c.depth * micro_batches;
  return p;
}

// ---- the GPT ----------------------------------------------------------------------------

namespace {

/// The GPT's own tensors (nn/gpt.cpp's constructor): the tables and the Linear weights have
/// f32 masters and 16-bit working copies under mixed precision; biases and LayerNorm weights
/// are f32; every gradient is f32, and the tied head's share of wte's has a buffer of its own.
StaticBytes gpt_static_bytes(const GptConfig& c) {
  const bool mixed = is_mixed(c.precision);
  const std::int64_t C = c.width, N = c.layers;
  const std::int64_t weights = (c.vocabulary + c.context) * C + N * 12 * C * C;
  const std::int64_t others = N * 13 * C + 2 * C;  // norms and biases; ln_f
  StaticBytes s;
  s.trainable = to_size(weights + others);
  s.parameters = to_size(mixed ? 2 * weights + 4 * others : 4 * (weights + others));
  s.master_weights = to_size(mixed ? 4 * weights : 0);
  s.gradients = 4 * s.trainable + to_size(4 * c.vocabulary * C);
  return s;
}

}  // namespace

GptLedger::GptLedger(const GptConfig& config, MemoryLedger& ledger)
    : config_(config), ledger_(ledger) {}

void GptLedger::start_micro_batch(std::int64_t sequences, std::int64_t length,
                                  std::string label) {
  sequences_ = sequences;
  length_ = length;
  label_ = std::move(label);
}

std::size_t GptLedger::state_bytes(std::int64_t channels_per_position) const {
  return to_size(sequences_ * length_ * channels_per_position * config_.width) *
         to_size(dtype_size(working_dtype(config_.precision)));
}

std::size_t GptLedger::statistics_bytes() const { return 4 * to_size(sequences_ * length_); }

std::size_t GptLedger::scores_bytes() const {
  return to_size(sequences_ * config_.heads * length_ * length_) *
         to_size(dtype_size(working_dtype(config_.precision)));
}

std::size_t GptLedger::attention_rows_bytes() const {
  return 4 * to_size(sequences_ * config_.heads * length_);
}

Bytes GptLedger::activation(std::size_t bytes, const Moment& what) {
  return ledger_.allocate(MemoryCategory::activations, bytes, moment(what));
}

Bytes GptLedger::workspace(std::size_t bytes, const Moment& what) {
  return ledger_.allocate(MemoryCategory::workspace, bytes, moment(what));
}

Bytes GptLedger::checkpoint(std::int64_t state) {
  return ledger_.allocate(MemoryCategory::checkpoints, state_bytes(),
                          moment("checkpoint of h" + std::to_string(state)));
}

Bytes GptLedger::block_forward(std::int64_t index, Bytes h, GptBlockBytes& saved,
                               BlockKeep keep, bool recompute) {
  BIGBATCH_CHECK(keep != BlockKeep::gemm_outputs,
                 "GptLedger: BlockKeep::gemm_outputs is the MLP block's");
  const std::string block = "block " + std::to_string(index) +
                            (recompute ? " forward (recomputed): " : " forward: ");
  const std::size_t scores = scores_bytes();
  saved.input = std::move(h);
  saved.ln_1_out = activation(state_bytes(), {block, "ln_1's output"});
  saved.ln_1_mean = activation(statistics_bytes(), {block, "ln_1's mean"});
  saved.ln_1_rstd = activation(statistics_bytes(), {block, "ln_1's rstd"});
  saved.qkv = activation(state_bytes(3), {block, "c_attn's output (q, k, v)"});
  saved.attention = activation(state_bytes(), {block, "the heads' output"});
  if (config_.attention == AttentionKernel::efficient) {
    BIGBATCH_CHECK(keep != BlockKeep::all_but_probabilities,
                   "GptLedger: efficient attention keeps no probabilities to drop");
    saved.row_stats = activation(2 * attention_rows_bytes(),
                                 {block, "the attention's row max and sum (f32)"});
  } else {
    saved.probabilities = activation(scores, {block, "the attention's probabilities"});
    if (keep == BlockKeep::all_but_probabilities) saved.probabilities = nullptr;  // recomputed
  }
  saved.middle = activation(state_bytes(), {block, "the attention's residual sum"});
  saved.ln_2_out = activation(state_bytes(), {block, "ln_2's output"});
  saved.ln_2_mean = activation(statistics_bytes(), {block, "ln_2's mean"});
  saved.ln_2_rstd = activation(statistics_bytes(), {block, "ln_2's rstd"});
  saved.fc = activation(state_bytes(4), {block, "c_fc's output"});
  saved.gelu = activation(state_bytes(4), {block, "gelu's output"});
  return activation(state_bytes(), {block, "the block's output"});
}

Bytes GptLedger::block_backward(std::int64_t index, const GptBlockBytes& saved) {
  const std::string block = "block " + std::to_string(index) + " backward: ";
  const bool dropout = config_.dropout > 0.0f;  // a training step's dropout is on
  // The MLP branch: through its dropout (a copy), c_proj, gelu, c_fc, ln_2.
  Bytes d_branch;
  if (dropout) d_branch = workspace(state_bytes(), {block, "the MLP branch's output gradient"});
  Bytes d_hidden = workspace(state_bytes(4), {block, "mlp.c_proj's input gradient"});
  const Bytes d_middle = workspace(state_bytes(), {block, "ln_2's input gradient"});
  d_hidden = nullptr;
  d_branch = nullptr;  // the attention branch reads d_middle, through a copy under dropout
  if (dropout) {
    d_branch = workspace(state_bytes(), {block, "the attention branch's output gradient"});
  }
  Bytes d_attention = workspace(state_bytes(), {block, "the heads' output gradient"});
  d_branch = nullptr;
  Bytes d_qkv = workspace(state_bytes(3), {block, "c_attn's output gradient"});
  Bytes probabilities;  // plain: the forward's, or rebuilt here when it dropped them
  if (config_.attention == AttentionKernel::plain && !saved.probabilities) {
    probabilities = activation(scores_bytes(), {block, "the attention's probabilities, recomputed"});
  }
  workspace(attention_rows_bytes(),
            {block, "the attention's row sums (f32)"});  // freed by the kernel
  probabilities = nullptr;
  d_attention = nullptr;
  Bytes d_input = workspace(state_bytes(), {block, "the block's input gradient"});
  d_qkv = nullptr;
  return d_input;
}

StepPrediction predict_gpt_step(const GptConfig& c, std::int64_t batch, std::int64_t micro_batch,
                                std::int64_t length, const Optimizer::Options& optimizer,
                                GptBlockLedgerRunner* runner, std::size_t held_workspace) {
  BIGBATCH_CHECK(batch > 0 && micro_batch > 0 && length > 0 && length <= c.context,
                 "predict_gpt_step: batch and micro_batch must be positive and the length in "
                 "1..", c.context, ", got ", batch, ", ", micro_batch, " and ", length);
  MemoryLedger ledger;
  const bool mixed = is_mixed(c.precision);
  const std::size_t T = to_size(length), V = to_size(c.vocabulary);
  const std::size_t W = to_size(dtype_size(working_dtype(c.precision)));

  // Live before the step: the model, its optimizer, one micro-batch of tokens and targets.
  const StaticBytes fixed = gpt_static_bytes(c);
  const std::size_t staged = staged_samples(batch, micro_batch);
  const std::vector<Bytes> live = live_before_step(
      ledger, {.parameters = fixed.parameters,
               .master_weights = fixed.master_weights,
               .gradients = fixed.gradients,
               .optimizer_state = fixed.trainable * optimizer_state_bytes_per_parameter(optimizer),
               .samples = 4 * staged * T,
               .labels = 4 * staged * T,
               .held_workspace = held_workspace});

  GptLedger model(c, ledger);
  Bytes loss = ledger.allocate(MemoryCategory::workspace, 4, "the loss");
  std::int64_t micro_batches = 0;
  for (std::int64_t begin = 0; begin < batch; begin += micro_batch) {
    const std::int64_t b = std::min(batch, begin + micro_batch) - begin;
    model.start_micro_batch(b, length, "micro-batch " + std::to_string(++micro_batches));
    const std::size_t n = to_size(b) * T;

    // Gpt::forward: the embeddings, the blocks, ln_f and the head.
    Bytes x = model.activation(model.state_bytes(), "forward: the embeddings (h0)");
    std::vector<GptBlockBytes> blocks;
    if (runner) {
      x = runner->forward(model, std::move(x));
    } else {
      blocks.resize(to_size(c.layers));
      for (std::int64_t i = 0; i < c.layers; ++i) {
        x = model.block_forward(i, x, blocks[to_size(i)], BlockKeep::all, false);
      }
    }
    Bytes normed = model.activation(model.state_bytes(), "forward: ln_f's output");
    Bytes mean = model.activation(model.statistics_bytes(), "forward: ln_f's mean");
    Bytes rstd = model.activation(model.statistics_bytes(), "forward: ln_f's rstd");
    const Bytes logits = model.activation(4 * n * V, "forward: the logits (f32)");
    // The loss (kernels/cross_entropy: one loss per position), its gradient.
    model.workspace(4 * n, "the loss: per-position losses");
    const Bytes d_logits = model.workspace(4 * n * V, "the loss's gradient");

    // Gpt::backward: the head, ln_f, the blocks last first; the embeddings' scatter-add
    // works in place.
    Bytes d_head;  // fp32: d_logits itself
    if (mixed) d_head = model.workspace(W * n * V, "backward: the logits' gradient in 16 bits");
    Bytes dx = model.workspace(model.state_bytes(), "backward: ln_f's input gradient");
    d_head = nullptr;
    x = normed = mean = rstd = nullptr;
    if (runner) {
      dx = runner->backward(model, std::move(dx));
    } else {
      for (std::int64_t i = c.layers; i-- > 0;) {
        dx = model.block_backward(i, blocks[to_size(i)]);
        blocks[to_size(i)] = GptBlockBytes{};
      }
    }
  }
  loss = nullptr;
  StepPrediction p;
  p.stats = ledger.stats();
  p.peak_moment = ledger.peak_moment();
  p.block_forwards = runner ? runner->evaluations() : c.layers * micro_batches;
  return p;
}

}  // namespace bigbatch::nn
