// test_gpt_training.cpp: chapter 08's GPT trained by the trainer every chapter uses
// (chapters/train/trainer.hpp), on token data sets (common/data/text_corpus.hpp):
//   - a trainer step is the hand-written step: one forward and backward of the whole batch,
//     the loss of every target divided by the batch's count of real (not padding) targets,
//     the tied head's share completed, one AdamW step;
//   - micro-batches of 1, 3 and 5 padded sequences of uneven real lengths give the batch's
//     parameters bit for bit over several steps, fp32 and bf16, with dropout;
//   - under fp16 the dynamic loss scaler's boundary skips an overflowing step and leaves the
//     weights as they were;
//   - a snapshot taken mid-run and restored into a fresh model continues to the
//     uninterrupted run's bits (fp16 with the dynamic scaler's state, dropout on);
//   - on chapter 07's simulated ranks, one rank is the single process to the bit, and three
//     ranks' gradient is each share's (its targets over the whole batch's count, its tied
//     head completed) added in rank order, to the bit; ZeRO is refused;
//   - evaluate() means over real targets; the MLP and the GPT refuse each other's data.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "chapters/07_data_parallel/data_parallel.hpp"
#include "chapters/train/snapshot.hpp"
#include "chapters/train/trainer.hpp"
#include "collectives/communicator.hpp"
#include "common/data/dataset.hpp"
#include "common/data/text_corpus.hpp"
#include "kernels/cross_entropy.hpp"
#include "nn/gpt.hpp"
#include "nn/model.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"
#include "tests/harness.hpp"
#include "tests/temp_files.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kLength = 8;  // T

/// Random documents of 2 to 20 bytes in sequences of 8 positions: the longer ones are cut
/// into pieces, most sequences are padded, and no two hold the same count of real targets
/// for long.
Dataset token_data(std::int64_t documents, std::uint64_t seed) {
  return make_token_dataset(make_sequences(synthetic_documents(documents, 2, 20, seed), kLength),
                            "synthetic-text");
}

nn::GptConfig small_gpt(nn::Precision precision = nn::Precision::fp32, float dropout = 0.1f) {
  return {.vocabulary = 256, .context = kLength, .layers = 2, .width = 16, .heads = 2,
          .dropout = dropout, .seed = 3, .precision = precision};
}

std::vector<std::vector<std::uint32_t>> parameter_bits(const nn::Network& model) {
  std::vector<std::vector<std::uint32_t>> bits;
  for (const nn::NamedParameter& p : model.parameters()) {
    const std::vector<float> values = p.value.to_vector<float>();
    std::vector<std::uint32_t> b(values.size());
    std::transform(values.begin(), values.end(), b.begin(),
                   [](float v) { return std::bit_cast<std::uint32_t>(v); });
    bits.push_back(std::move(b));
  }
  return bits;
}

train::TrainConfig steps_of(std::int64_t batch, std::int64_t micro_batch, std::int64_t steps) {
  train::TrainConfig config;
  config.batch = batch;
  config.micro_batch = micro_batch;
  config.steps = steps;
  config.seed = 11;
  return config;
}

TEST(GptTokenData, TokenDatasetsGatherRowsAndCountRealTargets) {
  const TokenSequences sequences = make_sequences({"abcdefghijkl", "xyz"}, 5);
  const Dataset data = make_token_dataset(sequences, "two");
  ASSERT_TRUE(data.holds_tokens());
  EXPECT_EQ(data.features.shape(), (Shape{4, 5}));  // 12 bytes: pieces of 5, 5 and 2 targets
  EXPECT_EQ(data.targets_per_sample(), 5);
  EXPECT_EQ(data.num_classes, 256);
  EXPECT_EQ(count_targets(data, {0, 1, 2, 3}), sequences.real_targets());
  EXPECT_EQ(count_targets(data, {3, 3}), 2 * sequences.real_targets(3, 4));
  const Tensor tokens({2, 5}, DType::i32), targets({2, 5}, DType::i32);
  gather_rows(data, {3, 0}, tokens, targets);
  const std::vector<std::int32_t> want_tokens = {'x', 'y', 0, 0, 0, 'a', 'b', 'c', 'd', 'e'};
  const std::vector<std::int32_t> want_targets = {'y', 'z', kIgnoredLabel, kIgnoredLabel,
                                                  kIgnoredLabel, 'b', 'c', 'd', 'e', 'f'};
  EXPECT_EQ(tokens.to_vector<std::int32_t>(), want_tokens);
  EXPECT_EQ(targets.to_vector<std::int32_t>(), want_targets);
  // A classification data set counts a target per sample.
  EXPECT_EQ(count_targets(testing::tiny_data(10), {1, 2, 2}), 3);
}

TEST(GptTrainer, AStepIsTheHandWrittenStepOverTheBatchsRealTargets) {
  const Dataset data = token_data(20, 5);
  const std::int64_t B = 6;
  nn::Gpt trained(small_gpt(), Device::cpu()), by_hand(small_gpt(), Device::cpu());
  nn::Optimizer optimizer(trained.parameters(), AdamWOptions{.lr = 1e-2});
  nn::Optimizer hand_optimizer(by_hand.parameters(), AdamWOptions{.lr = 1e-2});
  train::Trainer trainer(trained, optimizer, data, steps_of(B, 0, 2));
  const train::StepRecord record = trainer.step();

  // The same step written out: the whole batch at once, the loss over its real targets.
  const std::vector<std::int64_t> indices = trainer.batch_indices(0);
  const Tensor tokens({B, kLength}, DType::i32), targets({B, kLength}, DType::i32);
  gather_rows(data, indices, tokens, targets);
  const std::vector<std::int32_t> labels = targets.to_vector<std::int32_t>();
  const auto real = std::count_if(labels.begin(), labels.end(),
                                  [](std::int32_t t) { return t != kIgnoredLabel; });
  ASSERT_LT(real, B * kLength) << "the batch should hold padding";
  by_hand.zero_grad();
  const Tensor logits =
      by_hand.forward(tokens, {true, nn::dropout_seed_for_run(11), /*first_row=*/0});
  const Tensor flat = targets.reshaped({B * kLength});
  const Tensor loss = Tensor::zeros({1}, DType::f32);
  cross_entropy_forward(logits, flat, loss, static_cast<float>(real));
  const Tensor d_logits(logits.shape(), DType::f32);
  cross_entropy_backward(logits, flat, d_logits, static_cast<float>(real));
  by_hand.backward(d_logits);
  by_hand.complete_gradients();
  hand_optimizer.step();

  EXPECT_EQ(record.batch_samples, B);
  EXPECT_EQ(record.batch_targets, real);
  EXPECT_EQ(record.loss, loss.to_vector<float>()[0]);
  EXPECT_EQ(parameter_bits(trained), parameter_bits(by_hand));
}

/// The parameters after `steps` trainer steps of batch 12 over 20 documents' sequences,
/// shuffled, with micro-batches of `micro_batch` sequences.
std::vector<std::vector<std::uint32_t>> after_steps(nn::Precision precision,
                                                    std::int64_t micro_batch,
                                                    std::int64_t steps) {
  const Dataset data = token_data(20, 9);
  nn::Gpt model(small_gpt(precision), Device::cpu());
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{.lr = 1e-2});
  train::Trainer trainer(model, optimizer, data, steps_of(12, micro_batch, steps));
  trainer.run();
  return parameter_bits(model);
}

TEST(GptTrainer, MicroBatchesOfUnevenSequencesGiveTheBatchBitForBit) {
  ASSERT_GT(token_data(20, 9).size(), 12) << "the steps should cross an epoch";
  for (const nn::Precision precision : {nn::Precision::fp32, nn::Precision::bf16}) {
    SCOPED_TRACE(nn::precision_name(precision));
    const auto whole = after_steps(precision, 0, 3);
    for (const std::int64_t micro_batch : {1, 3, 5}) {
      SCOPED_TRACE("micro-batch " + std::to_string(micro_batch));
      EXPECT_EQ(after_steps(precision, micro_batch, 3), whole);
    }
  }
}

std::vector<std::vector<float>> gradient_values(const nn::Network& model) {
  std::vector<std::vector<float>> values;
  for (const nn::NamedParameter& p : model.parameters()) values.push_back(p.grad.to_vector<float>());
  return values;
}

TEST(GptRanks, OneSimulatedRankIsTheSingleProcessBitForBit) {
  const Dataset data = token_data(20, 9);
  nn::Gpt single(small_gpt(), Device::cpu()), ranked(small_gpt(), Device::cpu());
  nn::Optimizer plain_optimizer(single.parameters(), AdamWOptions{.lr = 1e-2});
  nn::Optimizer ranked_optimizer(ranked.parameters(), AdamWOptions{.lr = 1e-2});
  train::Trainer plain(single, plain_optimizer, data, steps_of(12, 5, 3));
  data_parallel::SimulatedRanks one(1, ranked);
  train::Trainer trainer(ranked, ranked_optimizer, data, steps_of(12, 5, 3), &one);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    EXPECT_EQ(plain.step().loss, trainer.step().loss);
    EXPECT_EQ(gradient_values(single), gradient_values(ranked));
  }
  EXPECT_EQ(parameter_bits(single), parameter_bits(ranked));
}

// Each rank's share of sequences, accumulated on its own from zero with the whole batch's
// count of real targets (its tied head completed on the rank), then the shares added by
// hand in rank order: the trainer's gradient to the bit. The shares hold other counts of
// real targets than a third of the batch's, so a rank that divided by its own count
// (Hugging Face's bug, across ranks) would give other gradients and another loss.
TEST(GptRanks, EachRankDividesByTheWholeBatchsTokensAndTheSharesAddInRankOrder) {
  const Dataset data = token_data(20, 5);
  const std::int64_t B = 10, micro_batch = 2;
  const int ranks = 3;  // shares of 4, 3 and 3 sequences
  nn::Gpt ranked(small_gpt(), Device::cpu()), by_hand(small_gpt(), Device::cpu());
  nn::Optimizer optimizer(ranked.parameters(), AdamWOptions{.lr = 1e-2});
  data_parallel::SimulatedRanks group(ranks, ranked);
  train::Trainer trainer(ranked, optimizer, data, steps_of(B, micro_batch, 1), &group);
  const train::StepRecord record = trainer.step();

  const Tensor tokens({B, kLength}, DType::i32), targets({B, kLength}, DType::i32);
  gather_rows(data, trainer.batch_indices(0), tokens, targets);
  const std::int64_t real = count_targets(data, trainer.batch_indices(0));
  EXPECT_EQ(record.batch_targets, real);
  std::vector<std::vector<float>> total;
  std::vector<float> losses;
  bool uneven = false;
  for (int r = 0; r < ranks; ++r) {
    const collectives::Share share = collectives::share_of(B, ranks, r);
    const std::vector<std::int64_t> all = trainer.batch_indices(0);
    const std::int64_t own = count_targets(
        data, {all.begin() + share.begin, all.begin() + share.begin + share.size});
    uneven = uneven || own * B != real * share.size;
    by_hand.zero_grad();
    losses.push_back(nn::accumulate_gradients(
        by_hand, tokens.rows(share.begin, share.begin + share.size),
        targets.rows(share.begin, share.begin + share.size), micro_batch,
        {true, nn::dropout_seed_for_run(11), share.begin}, /*global_count=*/real));
    const std::vector<std::vector<float>> g = gradient_values(by_hand);
    if (r == 0) {
      total = g;
      continue;
    }
    for (std::size_t p = 0; p < g.size(); ++p) {
      for (std::size_t i = 0; i < g[p].size(); ++i) total[p][i] = total[p][i] + g[p][i];
    }
  }
  ASSERT_TRUE(uneven) << "every share holds its part of the batch's targets: nothing to catch";
  EXPECT_EQ(gradient_values(ranked), total);
  EXPECT_EQ(record.loss, (losses[0] + losses[1]) + losses[2]);
}

TEST(GptRanks, ZeroAndOverlapAreTheMlpsAndRefused) {
  const Dataset data = token_data(10, 5);
  nn::Gpt model(small_gpt(), Device::cpu());
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{.lr = 1e-2});
  data_parallel::SimulatedRanks sharded(2, model, data_parallel::ZeroStage::optimizer_state);
  EXPECT_THROW(train::Trainer(model, optimizer, data, steps_of(4, 0, 1), &sharded),
               std::invalid_argument);
}

// The GPT does not tell its gradients group by group (its tied head's share reaches the
// embedding only once the batch is done), so a listener is refused before any forward,
// as a usage error, and the gradients are left as they were.
TEST(GptRanks, AListenerForGradientGroupsIsRefusedBeforeAnyForward) {
  const Dataset data = token_data(4, 5);
  nn::Gpt model(small_gpt(), Device::cpu());
  ASSERT_FALSE(model.releases_state());
  const Tensor tokens({4, kLength}, DType::i32), targets({4, kLength}, DType::i32);
  gather_rows(data, {0, 1, 2, 3}, tokens, targets);
  const nn::BatchRows rows = [&](std::int64_t begin, std::int64_t end) {
    return std::pair{tokens.rows(begin, end), targets.rows(begin, end)};
  };
  std::size_t told = 0;
  const nn::GradientsReady listener = [&](std::size_t, std::size_t) { ++told; };
  const std::vector<std::vector<float>> before = gradient_values(model);
  EXPECT_THROW(nn::accumulate_gradients(model, 4, rows, 2, {true, 0, 0},
                                        count_targets(data, {0, 1, 2, 3}), 1.0f, listener),
               std::invalid_argument);
  EXPECT_EQ(told, 0u);
  EXPECT_EQ(gradient_values(model), before) << "a backward ran before the refusal";
  EXPECT_THROW(model.release_gradients(0, 1), std::logic_error);
  EXPECT_THROW(model.release_master_weights(), std::logic_error);
  EXPECT_TRUE(model.holds_master_weights());
}

TEST(GptTrainer, Fp16OverflowSkipsTheStepAndLeavesTheWeights) {
  const Dataset data = token_data(20, 5);
  nn::Gpt model(small_gpt(nn::Precision::fp16, 0.0f), Device::cpu());
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{.lr = 1e-2});
  train::TrainConfig config = steps_of(6, 2, 3);
  config.loss_scaling = train::LossScaling::dynamic;
  // d_logits = S (p - y) / count: at S = 2^24 and about 30 targets, far past fp16's 65504
  // where they are rounded to the working type.
  config.dynamic_scaling.initial_scale = 16777216.0f;
  train::Trainer trainer(model, optimizer, data, config);
  const auto before = parameter_bits(model);
  const train::StepRecord first = trainer.step();
  EXPECT_TRUE(first.skipped);
  EXPECT_FALSE(std::isfinite(first.grad_norm));
  EXPECT_EQ(parameter_bits(model), before) << "a skipped step wrote the weights";
  const train::StepRecord second = trainer.step();
  EXPECT_EQ(second.loss_scale, first.loss_scale / 2) << "the scale did not back off";
  // Backed off until the step fits, the run goes on with finite losses.
  train::StepRecord last = second;
  while (last.skipped && trainer.steps_done() < trainer.total_steps()) last = trainer.step();
  EXPECT_TRUE(std::isfinite(last.loss));
}

// A GPT run, its optimizer and trainer, in fp16 under the dynamic scaler (its scale and
// counters are state too) with dropout: what a snapshot must bring back.
struct GptRun {
  explicit GptRun(const Dataset& data, std::int64_t width = 16)
      : model(shape(width), Device::cpu()),
        optimizer(model.parameters(), AdamWOptions{.lr = 1e-2}),
        trainer(model, optimizer, data, config()) {}
  static nn::GptConfig shape(std::int64_t width) {
    nn::GptConfig c = small_gpt(nn::Precision::fp16);
    c.width = width;
    return c;
  }
  static train::TrainConfig config() {
    train::TrainConfig c = steps_of(6, 2, 6);
    c.loss_scaling = train::LossScaling::dynamic;
    c.dynamic_scaling.initial_scale = 1024.0f;
    c.dynamic_scaling.growth_interval = 2;  // the scale moves within the run
    return c;
  }
  nn::Gpt model;
  nn::Optimizer optimizer;
  train::Trainer trainer;
};

TEST(GptTrainer, ASnapshotResumesToTheUninterruptedRunsBits) {
  const Dataset data = token_data(20, 7);
  const train::RunConfig settings = {{"model", "gpt"}};
  GptRun whole(data);
  whole.trainer.run();
  const testing::TemporaryDirectory dir;
  std::string path;
  {
    GptRun first(data);
    for (int step = 0; step < 3; ++step) first.trainer.step();
    path = train::Snapshots(dir.str(), 1).write(first.model, first.optimizer, first.trainer,
                                                settings);
  }
  GptRun resumed(data);
  train::restore_snapshot(path, resumed.model, resumed.optimizer, resumed.trainer, settings);
  EXPECT_EQ(resumed.trainer.steps_done(), 3);
  resumed.trainer.run();
  EXPECT_EQ(parameter_bits(resumed.model), parameter_bits(whole.model));
  EXPECT_EQ(resumed.trainer.state().scaler->scale, whole.trainer.state().scaler->scale);
  // Another shape is refused, naming a tensor, and leaves the trainer where it was.
  GptRun other(data, 24);
  EXPECT_THROW(train::restore_snapshot(path, other.model, other.optimizer, other.trainer,
                                       settings),
               std::runtime_error);
  EXPECT_EQ(other.trainer.steps_done(), 0);
}

TEST(GptTrainer, EvaluateMeansOverRealTargets) {
  const Dataset data = token_data(10, 5);
  nn::Gpt model(small_gpt(nn::Precision::fp32, 0.0f), Device::cpu());
  const nn::EvaluationResult result = nn::evaluate(model, data, 4);
  std::vector<std::int64_t> every(static_cast<std::size_t>(data.size()));
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(result.samples, data.size());
  EXPECT_EQ(result.targets, count_targets(data, every));
  EXPECT_EQ(count_targets(data), count_targets(data, every));
  // The same mean as the training loss over micro-batches of 4 (no dropout: the same
  // forward), which divides by the real targets the test counts itself.
  const float training_loss = nn::accumulate_gradients(model, data.features, data.labels, 4,
                                                       {true, 0, 0});
  EXPECT_EQ(static_cast<float>(result.loss), training_loss);
  EXPECT_GT(result.loss, 0.5 * std::log(256.0)) << "an untrained model guesses bytes";
  EXPECT_LE(result.correct, result.targets);
}

TEST(GptTrainer, EachModelRefusesTheOthersData) {
  const Dataset tokens = token_data(10, 5);
  const Dataset rows = testing::tiny_data(16);
  nn::Gpt gpt(small_gpt(), Device::cpu());
  nn::Model mlp(testing::tiny_model(1, 0.0f), Device::cpu());
  nn::Optimizer gpt_optimizer(gpt.parameters(), AdamWOptions{});
  nn::Optimizer mlp_optimizer(mlp.parameters(), AdamWOptions{});
  const train::TrainConfig config = steps_of(4, 0, 1);
  try {
    train::Trainer trainer(gpt, gpt_optimizer, rows, config);
    ADD_FAILURE() << "the GPT took rows of features";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(testing::mentions(e.what(), {"token sequences", rows.name})) << e.what();
  }
  try {
    train::Trainer trainer(mlp, mlp_optimizer, tokens, config, nullptr);
    ADD_FAILURE() << "the MLP took token sequences";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(testing::mentions(e.what(), {"f32 features", "synthetic-text"})) << e.what();
  }
  nn::GptConfig short_context = small_gpt();
  short_context.context = kLength - 1;
  nn::Gpt short_gpt(short_context, Device::cpu());
  nn::Optimizer short_optimizer(short_gpt.parameters(), AdamWOptions{});
  try {
    train::Trainer trainer(short_gpt, short_optimizer, tokens, config);
    ADD_FAILURE() << "sequences longer than the context were taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(testing::mentions(e.what(), {"8 tokens", "context is 7"})) << e.what();
  }
  // Token targets without the step's count: the micro-batches cannot tell it in time.
  nn::MicroBatchBuffer buffer(4, tokens, Device::cpu());
  const nn::BatchRows rows_of = [&](std::int64_t begin, std::int64_t end) {
    std::vector<std::int64_t> indices(static_cast<std::size_t>(end - begin));
    std::iota(indices.begin(), indices.end(), begin);
    return buffer.gather(tokens, indices);
  };
  EXPECT_THROW(nn::accumulate_gradients(gpt, 4, rows_of, 2, {}), std::invalid_argument);
}

TEST(GptTrainer, AFewStepsOnTheFortunesCorpusLowerTheValidationLoss) {
  // Debian's fortunes-min (a dependency of fortunes, which scripts/install-deps.sh installs).
  const std::string path = "/usr/share/games/fortunes/fortunes";
  if (!std::ifstream(path)) {
    GTEST_SKIP() << path << " not found: install the Debian package fortunes";
  }
  const std::vector<std::string> documents = read_documents(path);
  ASSERT_GT(documents.size(), 100u);
  // Every tenth document held out.
  std::vector<std::string> training, held_out;
  for (std::size_t i = 0; i < documents.size(); ++i) {
    (i % 10 == 9 ? held_out : training).push_back(documents[i]);
  }
  constexpr std::int64_t T = 32;
  const Dataset train_data = make_token_dataset(make_sequences(training, T), "fortunes/train");
  const Dataset validation = make_token_dataset(make_sequences(held_out, T), "fortunes/held-out");
  nn::GptConfig config = small_gpt(nn::Precision::fp32, 0.0f);
  config.context = T;
  config.width = 32;
  nn::Gpt model(config, Device::cpu());
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{.lr = 1e-2});
  const double before = nn::evaluate(model, validation, 64).loss;
  train::Trainer trainer(model, optimizer, train_data, steps_of(16, 4, 60));
  trainer.run();
  const double after = nn::evaluate(model, validation, 64).loss;
  // Untrained, the model spreads its guesses over 256 bytes (ln 256 = 5.5 nats); the bytes of
  // English text alone (unigram entropy about 4.4 bits, 3.0 nats) are worth more than a nat,
  // and 60 steps learn at least that much of them.
  EXPECT_NEAR(before, std::log(256.0), 0.1);
  EXPECT_LT(after, before - 1.0) << "before " << before << ", after " << after;
}

}  // namespace
}  // namespace bigbatch
