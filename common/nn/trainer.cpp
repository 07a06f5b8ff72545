// trainer.cpp: the sample stream, the training step and evaluation.
#include "common/nn/trainer.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/rng.hpp"
#include "kernels/cross_entropy.hpp"

namespace bigbatch::nn {
namespace {

// The RNG stream of the dropout seed; the permutations use streams 0, 1, ... (epochs),
// so the two never draw the same numbers.
constexpr std::uint64_t kDropoutSeedStream = ~std::uint64_t{0};

std::uint64_t random_u64(std::uint64_t seed, std::uint64_t stream, std::uint64_t pair) {
  const Philox4x32 words = random_group(seed, stream, pair / 2);
  const std::size_t w = 2 * (pair % 2);
  return (static_cast<std::uint64_t>(words.v[w]) << 32) | words.v[w + 1];
}

}  // namespace

std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                            std::int64_t epoch) {
  BIGBATCH_CHECK(n >= 0 && epoch >= 0, "epoch_permutation: n and epoch must be >= 0, got ",
                 n, " and ", epoch);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  // Fisher-Yates from the back: swap i with j uniform in [0, i]. j = floor(r (i + 1) / 2^64)
  // from 64 random bits r: its bias is below (i + 1) / 2^64, nothing for any real n.
  for (std::int64_t i = n - 1; i > 0; --i) {
    const unsigned __int128 r = random_u64(seed, static_cast<std::uint64_t>(epoch),
                                           static_cast<std::uint64_t>(i));
    const auto j = static_cast<std::int64_t>((r * static_cast<unsigned __int128>(i + 1)) >> 64);
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

Trainer::Trainer(Model& model, Optimizer& optimizer, const Dataset& data, TrainConfig config)
    : model_(model), optimizer_(optimizer), data_(data), config_(config) {
  BIGBATCH_CHECK(config_.batch > 0, "Trainer: batch must be positive, got ", config_.batch);
  BIGBATCH_CHECK(config_.micro_batch >= 0 && config_.micro_batch <= config_.batch,
                 "Trainer: micro_batch must lie in [0, batch = ", config_.batch, "], got ",
                 config_.micro_batch);
  if (config_.micro_batch == 0) config_.micro_batch = config_.batch;
  BIGBATCH_CHECK(data_.size() > 0, "Trainer: the data set '", data_.name, "' is empty");
  BIGBATCH_CHECK(data_.feature_dim() == model_.config().inputs, "Trainer: the data set has ",
                 data_.feature_dim(), " features per sample, the model takes ",
                 model_.config().inputs);
  BIGBATCH_CHECK(config_.steps > 0 || config_.epochs > 0,
                 "Trainer: give a positive number of steps or epochs");
  total_steps_ = config_.steps > 0
                     ? config_.steps
                     : (config_.epochs * data_.size() + config_.batch - 1) / config_.batch;
  dropout_seed_ = random_u64(config_.seed, kDropoutSeedStream, 0);
  batch_features_ = Tensor({config_.batch, data_.feature_dim()}, DType::f32, model_.device(),
                           MemoryCategory::data);
  batch_labels_ = Tensor({config_.batch}, DType::i32, model_.device(), MemoryCategory::data);
}

const std::vector<std::int64_t>& Trainer::permutation(std::int64_t epoch) const {
  for (int slot = 0; slot < 2; ++slot) {
    if (cached_epochs_[slot] == epoch) return cached_permutations_[slot];
  }
  // Replace the older epoch: batches move forward through the stream.
  const int slot = cached_epochs_[0] < cached_epochs_[1] ? 0 : 1;
  cached_permutations_[slot] = epoch_permutation(data_.size(), config_.seed, epoch);
  cached_epochs_[slot] = epoch;
  return cached_permutations_[slot];
}

std::vector<std::int64_t> Trainer::batch_indices(std::int64_t step) const {
  BIGBATCH_CHECK(step >= 0, "Trainer::batch_indices: step must be >= 0, got ", step);
  const std::int64_t n = data_.size();
  std::vector<std::int64_t> indices(static_cast<std::size_t>(config_.batch));
  for (std::int64_t b = 0; b < config_.batch; ++b) {
    const std::int64_t position = step * config_.batch + b;
    const std::int64_t in_epoch = position % n;
    indices[static_cast<std::size_t>(b)] =
        config_.shuffle ? permutation(position / n)[static_cast<std::size_t>(in_epoch)]
                        : in_epoch;
  }
  return indices;
}

StepRecord Trainer::step() {
  const std::int64_t k = steps_done_;
  gather_rows(data_, batch_indices(k), batch_features_, batch_labels_);
  model_.zero_grad();
  const ForwardContext context{true, dropout_seed_, k * config_.batch};
  const float loss = accumulate_gradients(model_, batch_features_, batch_labels_,
                                          config_.micro_batch, context);
  optimizer_.step();
  ++steps_done_;
  StepRecord record;
  record.step = steps_done_;
  record.loss = loss;
  record.samples = steps_done_ * config_.batch;
  record.peak_bytes = allocator_for(model_.device()).stats().peak;
  return record;
}

void Trainer::run(const std::function<void(const StepRecord&)>& on_step) {
  while (steps_done_ < total_steps_) {
    const StepRecord record = step();
    if (on_step) on_step(record);
  }
}

EvaluationResult evaluate(Model& model, const Dataset& data, std::int64_t batch) {
  BIGBATCH_CHECK(batch > 0, "evaluate: batch must be positive, got ", batch);
  BIGBATCH_CHECK(data.size() > 0, "evaluate: the data set '", data.name, "' is empty");
  const std::int64_t n = data.size();
  const Device device = model.device();
  // Every batch adds its share of the mean (global count N) into one float.
  const Tensor loss = Tensor::zeros({1}, DType::f32, device, MemoryCategory::workspace);
  EvaluationResult result;
  result.samples = n;
  for (std::int64_t begin = 0; begin < n; begin += batch) {
    const std::int64_t rows = std::min(batch, n - begin);
    std::vector<std::int64_t> indices(static_cast<std::size_t>(rows));
    std::iota(indices.begin(), indices.end(), begin);
    const Tensor x({rows, data.feature_dim()}, DType::f32, device, MemoryCategory::data);
    const Tensor labels({rows}, DType::i32, device, MemoryCategory::data);
    gather_rows(data, indices, x, labels);
    const Tensor logits = model.forward(x, ForwardContext{false, 0, begin});
    cross_entropy_forward(logits, labels, loss, static_cast<float>(n));
    result.correct += count_correct(logits, labels);
  }
  result.loss = loss.to_vector<float>()[0];
  result.accuracy = static_cast<double>(result.correct) / static_cast<double>(n);
  return result;
}

}  // namespace bigbatch::nn
