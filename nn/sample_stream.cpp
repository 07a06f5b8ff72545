// sample_stream.cpp: the data order of a run, and evaluation.
#include "nn/sample_stream.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/integer_math.hpp"
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

std::uint64_t dropout_seed_for_run(std::uint64_t seed) {
  return random_u64(seed, kDropoutSeedStream, 0);
}

SampleStream::SampleStream(const Dataset& data, std::int64_t batch, bool shuffle,
                           std::uint64_t seed, LastBatch last_batch)
    : data_(data), batch_(batch), shuffle_(shuffle), seed_(seed) {
  BIGBATCH_CHECK(batch_ > 0, "SampleStream: batch must be positive, got ", batch_);
  const std::int64_t n = data_.size();
  BIGBATCH_CHECK(n > 0, "SampleStream: the data set '", data_.name, "' is empty");
  BIGBATCH_CHECK(last_batch == LastBatch::keep_short || batch_ <= n,
                 "SampleStream: dropping the short last batch leaves no batch of ", batch_,
                 " in the ", n, " samples of '", data_.name, "'");
  batches_per_epoch_ = last_batch == LastBatch::drop ? n / batch_ : ceil_div(n, batch_);
}

const std::vector<std::int64_t>& SampleStream::permutation(std::int64_t epoch) const {
  if (cached_epoch_ != epoch) {
    cached_permutation_ = epoch_permutation(data_.size(), seed_, epoch);
    cached_epoch_ = epoch;
  }
  return cached_permutation_;
}

BatchPosition SampleStream::position(std::int64_t step) const {
  BIGBATCH_CHECK(step >= 0, "SampleStream::position: step must be >= 0, got ", step);
  const std::int64_t n = data_.size();
  BatchPosition p;
  p.epoch = step / batches_per_epoch_;
  p.index = step % batches_per_epoch_;
  const std::int64_t begin = p.index * batch_;
  p.size = std::min(batch_, n - begin);
  p.first_row = p.epoch * n + begin;
  return p;
}

std::vector<std::int64_t> SampleStream::batch_indices(std::int64_t step) const {
  const BatchPosition p = position(step);
  const std::int64_t begin = p.index * batch_;
  std::vector<std::int64_t> indices(static_cast<std::size_t>(p.size));
  if (shuffle_) {
    const std::vector<std::int64_t>& order = permutation(p.epoch);
    std::copy_n(order.begin() + begin, p.size, indices.begin());
  } else {
    std::iota(indices.begin(), indices.end(), begin);
  }
  return indices;
}

void SampleStream::gather(std::int64_t step, const Tensor& x, const Tensor& labels) const {
  const std::int64_t rows = position(step).size;
  BIGBATCH_CHECK(x.rank() == 2 && x.dim(0) == rows, "SampleStream::gather: step ", step,
                 "'s batch has ", rows, " samples, x is ", x.describe(),
                 " (pass x.rows(0, ", rows, ") for a short batch)");
  gather(step, 0, rows, x, labels);
}

void SampleStream::gather(std::int64_t step, std::int64_t begin, std::int64_t end,
                          const Tensor& x, const Tensor& labels) const {
  std::vector<std::int64_t> indices = batch_indices(step);
  const auto rows = static_cast<std::int64_t>(indices.size());
  BIGBATCH_CHECK(0 <= begin && begin < end && end <= rows, "SampleStream::gather: rows [",
                 begin, ", ", end, ") do not lie in step ", step, "'s batch of ", rows);
  BIGBATCH_CHECK(x.rank() == 2 && x.dim(0) == end - begin, "SampleStream::gather: rows [",
                 begin, ", ", end, ") need x of ", end - begin, " rows, x is ", x.describe());
  indices.erase(indices.begin() + end, indices.end());
  indices.erase(indices.begin(), indices.begin() + begin);
  gather_rows(data_, indices, x, labels);
}

MicroBatchBuffer::MicroBatchBuffer(std::int64_t rows, std::int64_t features, Device device)
    : x_({rows, features}, DType::f32, device, MemoryCategory::data),
      labels_({rows}, DType::i32, device, MemoryCategory::data) {}

MicroBatchBuffer::MicroBatchBuffer(std::int64_t rows, const Dataset& like, Device device)
    : x_({rows, like.feature_dim()}, like.features.dtype(), device, MemoryCategory::data),
      labels_(like.holds_tokens() ? Shape{rows, like.targets_per_sample()} : Shape{rows},
              DType::i32, device, MemoryCategory::data) {}

bool MicroBatchBuffer::holds(const Dataset& data) const {
  const Shape labels = data.holds_tokens() ? Shape{rows(), data.targets_per_sample()}
                                           : Shape{rows()};
  return x_.dim(1) == data.feature_dim() && x_.dtype() == data.features.dtype() &&
         labels_.shape() == labels;
}

std::pair<Tensor, Tensor> MicroBatchBuffer::first(std::int64_t rows) const {
  BIGBATCH_CHECK(rows > 0 && rows <= x_.dim(0), "MicroBatchBuffer: a micro-batch of ", rows,
                 " rows does not fit a buffer of ", x_.dim(0));
  return {x_.rows(0, rows), labels_.rows(0, rows)};
}

BatchRows MicroBatchBuffer::rows_of(const SampleStream& stream, std::int64_t step) {
  return [this, &stream, step](std::int64_t begin, std::int64_t end) {
    auto [x, labels] = first(end - begin);
    stream.gather(step, begin, end, x, labels);
    return std::pair{x, labels};
  };
}

std::pair<Tensor, Tensor> MicroBatchBuffer::gather(const Dataset& data,
                                                   const std::vector<std::int64_t>& indices) {
  auto [x, labels] = first(static_cast<std::int64_t>(indices.size()));
  gather_rows(data, indices, x, labels);
  return {x, labels};
}

BatchRows MicroBatchBuffer::rows_of(const Tensor& x, const Tensor& labels) {
  return [this, x, labels](std::int64_t begin, std::int64_t end) {
    auto [x_micro, labels_micro] = first(end - begin);
    x_micro.copy_from(x.rows(begin, end));
    labels_micro.copy_from(labels.rows(begin, end));
    return std::pair{x_micro, labels_micro};
  };
}

EvaluationResult evaluate(Network& model, const Dataset& data, std::int64_t batch) {
  BIGBATCH_CHECK(batch > 0, "evaluate: batch must be positive, got ", batch);
  BIGBATCH_CHECK(data.size() > 0, "evaluate: the data set '", data.name, "' is empty");
  model.check_data(data);
  MicroBatchBuffer buffer(std::min(batch, data.size()), data, model.device());
  return evaluate(model, data, buffer);
}

EvaluationResult evaluate(Network& model, const Dataset& data, MicroBatchBuffer& buffer) {
  BIGBATCH_CHECK(data.size() > 0, "evaluate: the data set '", data.name, "' is empty");
  model.check_data(data);
  BIGBATCH_CHECK(buffer.holds(data), "evaluate: the samples of '", data.name,
                 "' do not fit the buffer's rows");
  const std::int64_t n = data.size(), batch = buffer.rows();
  const std::int64_t targets = count_targets(data);
  BIGBATCH_CHECK(targets > 0, "evaluate: the data set '", data.name, "' has no target that is "
                 "not ignored");
  // Every batch adds its share of the mean (global count: the targets) into one float.
  const Tensor loss = Tensor::zeros({1}, DType::f32, model.device(), MemoryCategory::workspace);
  EvaluationResult result;
  result.samples = n;
  result.targets = targets;
  for (std::int64_t begin = 0; begin < n; begin += batch) {
    const std::int64_t rows = std::min(batch, n - begin);
    std::vector<std::int64_t> indices(static_cast<std::size_t>(rows));
    std::iota(indices.begin(), indices.end(), begin);
    const auto [x, labels] = buffer.gather(data, indices);
    const Tensor logits = model.forward(x, ForwardContext{false, 0, begin});
    const Tensor flat = targets_of(labels);
    cross_entropy_forward(logits, flat, loss, static_cast<float>(targets));
    result.correct += count_correct(logits, flat);
  }
  result.loss = loss.to_vector<float>()[0];
  result.accuracy = static_cast<double>(result.correct) / static_cast<double>(targets);
  return result;
}

}  // namespace bigbatch::nn
