// memory_model.cpp: the byte counts of memory_model.hpp. predict_step follows the
// allocations of nn/training.cpp, and each model's ledger those of its model (ModelLedger
// nn/model.cpp's, GptLedger nn/gpt.cpp's), in their order; a change there that allocates
// more, less or at another moment shows up in tests/test_memory_model.cpp.
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

/// A model's own tensors: (parameters, master weights, gradients) bytes.
struct StaticBytes {
  std::size_t parameters = 0, master_weights = 0, gradients = 0, trainable = 0;
};

/// A model's trainable tensors' element counts: the weights, which have f32 masters and
/// 16-bit working copies under mixed precision, and the rest (biases, norm weights), f32.
struct TrainableTensors {
  std::vector<std::int64_t> weights, others;
  /// Every count, the weights first.
  std::vector<std::int64_t> all() const {
    std::vector<std::int64_t> counts = weights;
    counts.insert(counts.end(), others.begin(), others.end());
    return counts;
  }
};

/// The MLP's: the Linear weights (stem, each block's fc1 and fc2, head), and the Linear
/// biases (stem, fc1, fc2, head) and the norms' weight and bias (blocks, head).
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

/// The bytes of `tensors` in `precision` (fp16 and bf16 take the same), with `buffers` f32
/// elements more among the parameters (BatchNorm's running statistics) and `more_gradients`
/// f32 gradient elements besides one per trainable element (the GPT's tied head).
StaticBytes bytes_of(const TrainableTensors& tensors, Precision precision,
                     std::int64_t buffers, std::int64_t more_gradients) {
  const bool mixed = is_mixed(precision);
  const std::int64_t weights = sum(tensors.weights), others = sum(tensors.others);
  StaticBytes s;
  s.trainable = to_size(weights + others);
  s.parameters = to_size((mixed ? 2 * weights + 4 * others : 4 * (weights + others)) + 4 * buffers);
  s.master_weights = to_size(mixed ? 4 * weights : 0);
  s.gradients = 4 * (s.trainable + to_size(more_gradients));
  return s;
}

StaticBytes static_bytes(const ModelConfig& c) {
  // BatchNorm's running mean and variance, per norm layer (blocks and head): parameters.
  const std::int64_t running = c.norm == Norm::batch ? (c.depth + 1) * 2 * c.hidden : 0;
  return bytes_of(trainable_tensors(c), c.precision, running, 0);
}

}  // namespace

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

// ---- any model's replay -------------------------------------------------------------------

void NetworkLedger::start_step(MemoryLedger& ledger, bool released_gradients,
                               std::size_t bucket_bytes) {
  BIGBATCH_CHECK(!released_gradients || releases_state(), "NetworkLedger: this model's backward "
                 "does not release its gradients, so no step holds them in part");
  ledger_ = &ledger;
  released_gradients_ = released_gradients;
  bucket_bytes_ = bucket_bytes;
  open_.clear();
  in_flight_.clear();
  open_bytes_ = 0;
  held_.clear();
}

void NetworkLedger::start_micro_batch(std::int64_t samples, std::string label) {
  samples_ = samples;
  label_ = std::move(label);
}

Bytes NetworkLedger::activation(std::size_t bytes, const Moment& what) {
  return ledger_->allocate(MemoryCategory::activations, bytes, moment(what));
}

Bytes NetworkLedger::workspace(std::size_t bytes, const Moment& what) {
  return ledger_->allocate(MemoryCategory::workspace, bytes, moment(what));
}

Bytes NetworkLedger::checkpoint(std::int64_t state) {
  return ledger_->allocate(MemoryCategory::checkpoints, state_bytes(),
                           moment("store h" + std::to_string(state) + " as a checkpoint"));
}

Bytes NetworkLedger::gradients(std::int64_t elements, const Moment& what) {
  if (!released_gradients_) return nullptr;
  return ledger_->allocate(MemoryCategory::gradients, 4 * to_size(elements), moment(what));
}

void NetworkLedger::gradients_done(Bytes gradients, bool last) {
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

/// The bytes live before the step of a model holding `held` of its state.
BeforeStep before_step(const ModelBytes& model, std::int64_t batch, std::int64_t micro_batch,
                       const Optimizer::Options& optimizer, std::size_t held_workspace,
                       const HeldElements& held) {
  const auto in_range = [](std::int64_t part, std::int64_t whole) {
    return part >= -1 && part <= whole;
  };
  BIGBATCH_CHECK(in_range(held.optimizer_state, model.trainable) &&
                     in_range(held.gradients, model.trainable) &&
                     in_range(held.master_weights, model.master_elements),
                 "predict_step: held optimizer state ", held.optimizer_state, ", gradients ",
                 held.gradients, " of ", model.trainable, " trainable elements, master weights ",
                 held.master_weights, " of ", model.master_elements);
  BIGBATCH_CHECK(held.gradient_bucket_bytes == 0 || held.gradients >= 0,
                 "predict_step: gradient buckets of ", held.gradient_bucket_bytes,
                 " bytes for gradients held whole");
  // The samples the micro-batch buffer holds: one micro-batch's, or the batch's when smaller.
  const std::size_t staged = to_size(std::min(batch, micro_batch));
  const std::size_t stepped = to_size(held.optimizer_state < 0 ? model.trainable
                                                                : held.optimizer_state);
  return {.parameters = model.parameters,
          .master_weights = held.master_weights < 0 || model.master_weights == 0
                                ? model.master_weights
                                : 4 * to_size(held.master_weights),
          .gradients = held.gradients < 0 ? model.gradients : 4 * to_size(held.gradients),
          .optimizer_state = stepped * optimizer_state_bytes_per_parameter(optimizer),
          .samples = staged * model.sample,
          .labels = staged * model.labels,
          .held_workspace = held_workspace};
}

}  // namespace

StepPrediction predict_step(NetworkLedger& model, std::int64_t batch, std::int64_t micro_batch,
                            const Optimizer::Options& optimizer, BlockLedgerRunner* runner,
                            std::size_t held_workspace, const HeldElements& held) {
  BIGBATCH_CHECK(batch > 0 && micro_batch > 0, "predict_step: batch and micro_batch must be "
                 "positive, got ", batch, " and ", micro_batch);
  MemoryLedger ledger;
  const std::vector<Bytes> live = live_before_step(
      ledger, before_step(model.held(), batch, micro_batch, optimizer, held_workspace, held));
  model.start_step(ledger, held.gradients >= 0, held.gradient_bucket_bytes);
  Bytes loss = ledger.allocate(MemoryCategory::workspace, 4, "the loss");
  std::int64_t micro_batches = 0;
  for (std::int64_t begin = 0; begin < batch; begin += micro_batch) {
    model.start_micro_batch(std::min(batch, begin + micro_batch) - begin,
                            "micro-batch " + std::to_string(++micro_batches));
    // The forward: the stem, the blocks (in the runner's order, or each keeping all), the
    // head with the loss and the head's backward; then the blocks' backward, last first.
    Bytes h = model.stem_forward();
    std::vector<BlockBytes> blocks;
    if (runner) {
      h = runner->forward(model, std::move(h));
    } else {
      blocks.resize(to_size(model.depth()));
      for (std::int64_t i = 0; i < model.depth(); ++i) {
        h = model.block_forward(i, std::move(h), blocks[to_size(i)], BlockKeep::all, false);
      }
    }
    Bytes dh = model.head(std::move(h));
    if (runner) {
      dh = runner->backward(model, std::move(dh));
    } else {
      for (std::int64_t i = model.depth(); i-- > 0;) {
        dh = model.block_backward(i, blocks[to_size(i)]);
        blocks[to_size(i)] = BlockBytes{};
      }
    }
    model.stem_backward();
    model.end_micro_batch();
  }
  loss = nullptr;  // read back and released as accumulate_gradients returns
  StepPrediction p;
  p.stats = ledger.stats();
  p.peak_moment = ledger.peak_moment();
  p.block_forwards = runner ? runner->evaluations() : model.depth() * micro_batches;
  return p;
}

// ---- the MLP ------------------------------------------------------------------------------

namespace {

/// The MLP block's saved tensors in BlockBytes::kept (BlockActivations' names).
namespace mlp_kept {
enum : std::size_t {
  input,           // the block's input h
  normed,          // ln(h); none under BlockKeep::gemm_outputs
  mean,            // ln's mean
  rstd,            // ln's 1 / sqrt(var + eps)
  pre_activation,  // fc1's output
  hidden,          // fc2's input, after dropout; none under BlockKeep::gemm_outputs
};
}  // namespace mlp_kept

}  // namespace

ModelBytes ModelLedger::held() const {
  const StaticBytes fixed = static_bytes(config_);
  return {.parameters = fixed.parameters,
          .master_weights = fixed.master_weights,
          .gradients = fixed.gradients,
          .trainable = static_cast<std::int64_t>(fixed.trainable),
          .master_elements = sum(master_weight_sizes()),
          .sample = 4 * to_size(config_.inputs),  // x, f32
          .labels = 4};                           // the label, i32
}

std::vector<std::int64_t> ModelLedger::trainable_sizes() const {
  return trainable_tensors(config_).all();
}

std::vector<std::int64_t> ModelLedger::master_weight_sizes() const {
  return trainable_tensors(config_).weights;
}

std::size_t ModelLedger::state_bytes() const {
  return to_size(samples() * config_.hidden) * dtype_size(working_dtype(config_.precision));
}

std::size_t ModelLedger::statistics_bytes() const {
  // f32 per row (LayerNorm) or per feature (BatchNorm in training).
  return 4 * to_size(config_.norm == Norm::layer ? samples() : config_.hidden);
}

Bytes ModelLedger::stem_forward() {
  if (is_mixed(config_.precision)) {  // fp32 reads x itself
    hold(activation(2 * to_size(samples() * config_.inputs), "forward: the input in 16 bits"));
  }
  hold(activation(state_bytes(), "forward: stem's output"));
  return activation(state_bytes(), "forward: the stem's activation (h0)");
}

Bytes ModelLedger::block_forward(std::int64_t index, Bytes h, BlockBytes& saved, BlockKeep keep,
                                 bool recompute) {
  using namespace mlp_kept;
  BIGBATCH_CHECK(keeps(keep), "ModelLedger: the MLP's block has no attention probabilities");
  const std::string block =
      "block " + std::to_string(index) + (recompute ? " forward (recomputed): " : " forward: ");
  const std::size_t state = state_bytes(), inner = state * to_size(config_.expansion);
  auto& kept = saved.kept;
  kept[input] = std::move(h);
  kept[normed] = activation(state, {block, "ln's output"});
  kept[mean] = activation(statistics_bytes(), {block, "ln's mean"});
  kept[rstd] = activation(statistics_bytes(), {block, "ln's rstd"});
  kept[pre_activation] = activation(inner, {block, "fc1's output"});
  kept[hidden] = activation(inner, {block, "the activation after dropout"});
  Bytes output = activation(state, {block, "the block's output"});
  if (keep == BlockKeep::gemm_outputs) kept[normed] = kept[hidden] = nullptr;
  return output;
}

Bytes ModelLedger::head(Bytes h_n) {
  const std::size_t b = to_size(samples()), k = to_size(config_.classes);
  const std::int64_t h = config_.hidden;
  // The forward: the head's norm, the logits (f32).
  Bytes normed = activation(state_bytes(), "forward: head.ln's output");
  Bytes mean = activation(statistics_bytes(), "forward: head.ln's mean");
  Bytes rstd = activation(statistics_bytes(), "forward: head.ln's rstd");
  hold(activation(4 * b * k, "forward: the logits"));
  // The loss (kernels/cross_entropy: one loss per row), its gradient.
  workspace(4 * b, "the loss: per-row losses");
  hold(workspace(4 * b * k, "the loss's gradient"));
  // The head's backward.
  Bytes head_gradients =
      gradients(2 * h + config_.classes * h + config_.classes, "backward: the head's gradients");
  Bytes d_logits;  // fp32: the loss's gradient itself
  if (is_mixed(config_.precision)) {
    d_logits = workspace(2 * b * k, "backward: the logits' gradient in 16 bits");
  }
  const Bytes d_normed = workspace(state_bytes(), "backward: head.ln's output gradient");
  d_logits = nullptr;
  Bytes dh = workspace(state_bytes(), "backward: the head's input gradient");
  if (config_.norm == Norm::batch) workspace(8 * to_size(h), "backward: head.ln's batch means");
  gradients_done(std::move(head_gradients), /*last=*/false);  // summed over ranks
  h_n = nullptr;  // the norm's input, which its backward read
  return dh;
}

Bytes ModelLedger::block_backward(std::int64_t index, const BlockBytes& saved) {
  using namespace mlp_kept;
  const std::string block = "block " + std::to_string(index) + " backward: ";
  const std::size_t state = state_bytes(), inner = state * to_size(config_.expansion);
  const std::int64_t h = config_.hidden, e = config_.expansion * config_.hidden;
  // ln's weight and bias, fc1's and fc2's weight and bias.
  Bytes gradients_of_block =
      gradients(2 * h + (e * h + e) + (h * e + h), {block, "the block's gradients"});
  const Bytes d_hidden = workspace(inner, {block, "fc2's input gradient"});
  Bytes after_dropout = saved.kept[hidden];
  if (!after_dropout) {
    after_dropout = activation(inner, {block, "the activation after dropout, recomputed"});
  }
  after_dropout = nullptr;
  Bytes ln_output = saved.kept[normed];
  if (!ln_output) {
    ln_output = activation(state, {block, "ln's output, recomputed"});
    const Bytes ln_mean = activation(statistics_bytes(), {block, "ln's mean, recomputed"});
    const Bytes ln_rstd = activation(statistics_bytes(), {block, "ln's rstd, recomputed"});
  }
  const Bytes d_normed = workspace(state, {block, "fc1's input gradient"});
  ln_output = nullptr;
  Bytes d_input = workspace(state, {block, "the block's input gradient"});
  if (config_.norm == Norm::batch) {  // kernels/batchnorm: the batch means of dy, dy xhat
    workspace(8 * to_size(config_.hidden), {block, "BatchNorm's batch means"});
  }
  gradients_done(std::move(gradients_of_block), /*last=*/false);
  return d_input;
}

void ModelLedger::stem_backward() {
  // The stem's backward works in place and allocates nothing but its gradients, when they
  // were released.
  gradients_done(gradients(config_.inputs * config_.hidden + config_.hidden,
                           "backward: the stem's gradients"),
                 /*last=*/true);
}

// ---- the GPT ----------------------------------------------------------------------------

namespace {

/// The GPT's trainable tensors (nn/gpt.cpp's constructor): the tables and the Linear
/// weights, which have f32 masters and 16-bit working copies under mixed precision; and the
/// rest, biases and LayerNorm weights, f32.
TrainableTensors gpt_tensors(const GptConfig& c) {
  const std::int64_t C = c.width;
  TrainableTensors t;
  t.weights = {c.vocabulary * C, c.context * C};  // wte, wpe
  t.others = {C, C};                              // ln_f's weight and bias
  for (std::int64_t b = 0; b < c.layers; ++b) {
    // attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; ln_1, their biases, ln_2, theirs.
    t.weights.insert(t.weights.end(), {3 * C * C, C * C, 4 * C * C, 4 * C * C});
    t.others.insert(t.others.end(), {C, C, 3 * C, C, C, C, 4 * C, C});
  }
  return t;
}

/// The GPT's own bytes: every gradient is f32, and the tied head's share of wte's has a
/// buffer of its own.
StaticBytes gpt_static_bytes(const GptConfig& c) {
  return bytes_of(gpt_tensors(c), c.precision, 0, c.vocabulary * c.width);
}

/// The transformer block's saved tensors in BlockBytes::kept (GptBlockActivations' names).
namespace gpt_kept {
enum : std::size_t {
  input,          // x entering the block (the previous block's output)
  ln_1_out,       // ln_1(x)
  ln_1_mean,      // ln_1's means (f32)
  ln_1_rstd,      // ln_1's 1 / sqrt(var + eps) (f32)
  qkv,            // c_attn's output
  attention,      // the heads' output
  probabilities,  // plain attention's P [b, heads, T, T]
  row_stats,      // efficient attention's (m, l) [b, heads, T, 2] f32
  middle,         // x after the attention's residual
  ln_2_out,       // ln_2(middle)
  ln_2_mean,      // ln_2's means (f32)
  ln_2_rstd,      // ln_2's 1 / sqrt(var + eps) (f32)
  fc,             // c_fc's output
  gelu,           // gelu(fc), mlp.c_proj's input
  count
};
static_assert(count <= BlockBytes::kMaxKept);
}  // namespace gpt_kept

}  // namespace

GptLedger::GptLedger(const GptConfig& config, std::int64_t length)
    : config_(config), length_(length) {
  BIGBATCH_CHECK(length > 0 && length <= config.context, "GptLedger: the length must be in 1..",
                 config.context, ", got ", length);
}

ModelBytes GptLedger::held() const {
  const StaticBytes fixed = gpt_static_bytes(config_);
  return {.parameters = fixed.parameters,
          .master_weights = fixed.master_weights,
          .gradients = fixed.gradients,
          .trainable = static_cast<std::int64_t>(fixed.trainable),
          .master_elements = sum(master_weight_sizes()),
          .sample = 4 * to_size(length_),   // tokens, i32
          .labels = 4 * to_size(length_)};  // targets, i32
}

std::vector<std::int64_t> GptLedger::trainable_sizes() const { return gpt_tensors(config_).all(); }

std::vector<std::int64_t> GptLedger::master_weight_sizes() const {
  return gpt_tensors(config_).weights;
}

bool GptLedger::keeps(BlockKeep keep) const {
  return Gpt::keeps(keep) &&
         (keep != BlockKeep::all_but_probabilities || config_.attention == AttentionKernel::plain);
}

std::size_t GptLedger::states_bytes(std::int64_t channels_per_position) const {
  return to_size(samples() * length_ * channels_per_position * config_.width) *
         to_size(dtype_size(working_dtype(config_.precision)));
}

std::size_t GptLedger::statistics_bytes() const { return 4 * to_size(samples() * length_); }

std::size_t GptLedger::scores_bytes() const {
  return to_size(samples() * config_.heads * length_ * length_) *
         to_size(dtype_size(working_dtype(config_.precision)));
}

std::size_t GptLedger::attention_rows_bytes() const {
  return 4 * to_size(samples() * config_.heads * length_);
}

Bytes GptLedger::stem_forward() {
  return activation(state_bytes(), "forward: the embeddings (h0)");
}

Bytes GptLedger::block_forward(std::int64_t index, Bytes h, BlockBytes& saved, BlockKeep keep,
                               bool recompute) {
  using namespace gpt_kept;
  BIGBATCH_CHECK(keeps(keep), "GptLedger: a transformer block keeps all, or all but plain "
                 "attention's probabilities");
  const std::string block = "block " + std::to_string(index) +
                            (recompute ? " forward (recomputed): " : " forward: ");
  auto& kept = saved.kept;
  kept[input] = std::move(h);
  kept[ln_1_out] = activation(state_bytes(), {block, "ln_1's output"});
  kept[ln_1_mean] = activation(statistics_bytes(), {block, "ln_1's mean"});
  kept[ln_1_rstd] = activation(statistics_bytes(), {block, "ln_1's rstd"});
  kept[qkv] = activation(states_bytes(3), {block, "c_attn's output (q, k, v)"});
  kept[attention] = activation(state_bytes(), {block, "the heads' output"});
  if (config_.attention == AttentionKernel::efficient) {
    kept[row_stats] = activation(2 * attention_rows_bytes(),
                                 {block, "the attention's row max and sum (f32)"});
  } else {
    kept[probabilities] = activation(scores_bytes(), {block, "the attention's probabilities"});
    if (keep == BlockKeep::all_but_probabilities) kept[probabilities] = nullptr;  // recomputed
  }
  kept[middle] = activation(state_bytes(), {block, "the attention's residual sum"});
  kept[ln_2_out] = activation(state_bytes(), {block, "ln_2's output"});
  kept[ln_2_mean] = activation(statistics_bytes(), {block, "ln_2's mean"});
  kept[ln_2_rstd] = activation(statistics_bytes(), {block, "ln_2's rstd"});
  kept[fc] = activation(states_bytes(4), {block, "c_fc's output"});
  kept[gelu] = activation(states_bytes(4), {block, "gelu's output"});
  return activation(state_bytes(), {block, "the block's output"});
}

Bytes GptLedger::head(Bytes h_n) {
  const std::size_t n = to_size(samples() * length_), V = to_size(config_.vocabulary);
  // The forward: ln_f and the head.
  Bytes normed = activation(state_bytes(), "forward: ln_f's output");
  Bytes mean = activation(statistics_bytes(), "forward: ln_f's mean");
  Bytes rstd = activation(statistics_bytes(), "forward: ln_f's rstd");
  hold(activation(4 * n * V, "forward: the logits (f32)"));
  // The loss (kernels/cross_entropy: one loss per position), its gradient.
  workspace(4 * n, "the loss: per-position losses");
  hold(workspace(4 * n * V, "the loss's gradient"));
  // The backward of the head and ln_f (the embeddings' scatter-add works in place).
  Bytes d_head;  // fp32: the loss's gradient itself
  if (is_mixed(config_.precision)) {
    d_head = workspace(to_size(dtype_size(working_dtype(config_.precision))) * n * V,
                       "backward: the logits' gradient in 16 bits");
  }
  Bytes dx = workspace(state_bytes(), "backward: ln_f's input gradient");
  h_n = nullptr;  // ln_f's input, which its backward read
  return dx;
}

Bytes GptLedger::block_backward(std::int64_t index, const BlockBytes& saved) {
  const std::string block = "block " + std::to_string(index) + " backward: ";
  const bool dropout = config_.dropout > 0.0f;  // a training step's dropout is on
  // The MLP branch: through its dropout (a copy), c_proj, gelu, c_fc, ln_2.
  Bytes d_branch;
  if (dropout) d_branch = workspace(state_bytes(), {block, "the MLP branch's output gradient"});
  Bytes d_hidden = workspace(states_bytes(4), {block, "mlp.c_proj's input gradient"});
  const Bytes d_middle = workspace(state_bytes(), {block, "ln_2's input gradient"});
  d_hidden = nullptr;
  d_branch = nullptr;  // the attention branch reads d_middle, through a copy under dropout
  if (dropout) {
    d_branch = workspace(state_bytes(), {block, "the attention branch's output gradient"});
  }
  Bytes d_attention = workspace(state_bytes(), {block, "the heads' output gradient"});
  d_branch = nullptr;
  Bytes d_qkv = workspace(states_bytes(3), {block, "c_attn's output gradient"});
  Bytes rebuilt;  // plain: the forward's P, or rebuilt here when it dropped them
  if (config_.attention == AttentionKernel::plain && !saved.kept[gpt_kept::probabilities]) {
    rebuilt = activation(scores_bytes(), {block, "the attention's probabilities, recomputed"});
  }
  workspace(attention_rows_bytes(),
            {block, "the attention's row sums (f32)"});  // freed by the kernel
  rebuilt = nullptr;
  d_attention = nullptr;
  Bytes d_input = workspace(state_bytes(), {block, "the block's input gradient"});
  d_qkv = nullptr;
  return d_input;
}

}  // namespace bigbatch::nn
