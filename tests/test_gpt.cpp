// The GPT of chapter 08 (nn/gpt.hpp): nanoGPT's names, shapes, count and initialisation; the
// float64 twin's gradients against finite differences of its loss (padding included); micro-
// batches of sequences of uneven lengths against the batch, bit for bit, with the tied head;
// causality through the whole model; save and load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/data/dataset.hpp"
#include "common/data/text_corpus.hpp"
#include "common/memory.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/dropout.hpp"
#include "nn/gpt.hpp"
#include "tests/dropout_sites.hpp"
#include "tests/finite_difference.hpp"
#include "tests/harness.hpp"
#include "tests/temp_files.hpp"

namespace bigbatch {
namespace {

using nn::ForwardContext;
using nn::Gpt;
using nn::GptConfig;

/// Token sequences and their next-token targets; a sequence of `length` real tokens is
/// padded to T, its padding's targets ignored.
struct Sequences {
  std::int64_t b = 0, T = 0;
  std::vector<std::int32_t> tokens, targets;  // [b, T]
  std::int64_t real_targets() const {
    std::int64_t count = 0;
    for (const std::int32_t t : targets) count += t != kIgnoredLabel ? 1 : 0;
    return count;
  }
  Sequences slice(std::int64_t first, std::int64_t count) const {
    Sequences s{count, T, {}, {}};
    s.tokens.assign(tokens.begin() + first * T, tokens.begin() + (first + count) * T);
    s.targets.assign(targets.begin() + first * T, targets.begin() + (first + count) * T);
    return s;
  }
};

Sequences random_sequences(const std::vector<std::int64_t>& lengths, std::int64_t T,
                         std::int64_t vocabulary, std::uint64_t seed) {
  Sequences s{static_cast<std::int64_t>(lengths.size()), T, {}, {}};
  const auto u = testing::random_values(s.b * (T + 1), seed, 0, 1);
  for (std::int64_t i = 0; i < s.b; ++i) {
    for (std::int64_t t = 0; t < T; ++t) {
      const bool real = t < lengths[i];
      s.tokens.push_back(real ? static_cast<std::int32_t>(u[i * (T + 1) + t] * vocabulary) : 0);
      // The target of position t is token t + 1; the last real position's comes from the
      // document's continuation, which the draw at t + 1 stands for.
      s.targets.push_back(real ? static_cast<std::int32_t>(u[i * (T + 1) + t + 1] * vocabulary)
                               : kIgnoredLabel);
    }
  }
  return s;
}

/// One micro-batch's forward, loss and backward with the step's global target count;
/// returns the loss it added. `drawn`, when given, receives every dropout's spec
/// (ForwardContext::drawn_dropouts).
double forward_backward(Gpt& model, const Sequences& s, std::int64_t first_sequence,
                        float global_count, std::uint64_t dropout_seed, float loss_scale = 1.0f,
                        std::vector<DropoutSpec>* drawn = nullptr) {
  const Device device = model.device();
  const Tensor tokens = Tensor::from_vector(s.tokens, {s.b, s.T}, device);
  const Tensor targets = Tensor::from_vector(s.targets, {s.b * s.T}, device);
  ForwardContext context;
  context.dropout_seed = dropout_seed;
  context.first_row = first_sequence;
  context.drawn_dropouts = drawn;
  const Tensor logits = model.forward(tokens, context);
  const Tensor loss = Tensor::zeros({1}, logits.dtype(), device);
  cross_entropy_forward(logits, targets, loss, global_count);
  const Tensor d_logits(logits.shape(), logits.dtype(), device, MemoryCategory::workspace);
  cross_entropy_backward(logits, targets, d_logits, global_count, loss_scale);
  model.backward(d_logits);
  return testing::to_doubles(loss)[0];
}

// ---- names, shapes, count, initialisation --------------------------------------------

// nanoGPT's shakespeare-char shape with bytes (V = 256) and biases: each block holds ln_1,
// c_attn (C x 3C + 3C), c_proj (C x C + C), ln_2, c_fc (C x 4C + 4C) and c_proj (4C x C + C):
// 12 C^2 + 13 C; then wte and wpe, and ln_f.
TEST(GptParameters, NamesShapesAndCountAreNanoGpts) {
  const GptConfig config{256, 256, 6, 384, 6, 0.0f, 1, nn::Precision::fp32};
  const Gpt model(config, Device::cpu());
  const auto parameters = model.parameters();
  ASSERT_EQ(parameters.size(), 2 + 6 * 12 + 2u);
  const std::vector<std::pair<std::string, Shape>> first = {
      {"transformer.wte.weight", {256, 384}},
      {"transformer.wpe.weight", {256, 384}},
      {"transformer.h.0.ln_1.weight", {384}},
      {"transformer.h.0.ln_1.bias", {384}},
      {"transformer.h.0.attn.c_attn.weight", {1152, 384}},
      {"transformer.h.0.attn.c_attn.bias", {1152}},
      {"transformer.h.0.attn.c_proj.weight", {384, 384}},
      {"transformer.h.0.attn.c_proj.bias", {384}},
      {"transformer.h.0.ln_2.weight", {384}},
      {"transformer.h.0.ln_2.bias", {384}},
      {"transformer.h.0.mlp.c_fc.weight", {1536, 384}},
      {"transformer.h.0.mlp.c_fc.bias", {1536}},
      {"transformer.h.0.mlp.c_proj.weight", {384, 1536}},
      {"transformer.h.0.mlp.c_proj.bias", {384}}};
  for (std::size_t k = 0; k < first.size(); ++k) {
    EXPECT_EQ(parameters[k].name, first[k].first);
    EXPECT_EQ(parameters[k].shape(), first[k].second) << first[k].first;
  }
  EXPECT_EQ(parameters[2 + 5 * 12].name, "transformer.h.5.ln_1.weight");
  EXPECT_EQ(parameters[parameters.size() - 2].name, "transformer.ln_f.weight");
  EXPECT_EQ(parameters.back().name, "transformer.ln_f.bias");
  const std::int64_t C = 384;
  EXPECT_EQ(model.parameter_count(), 6 * (12 * C * C + 13 * C) + (256 + 256) * C + 2 * C);
  EXPECT_EQ(nn::gpt_parameter_count(config), model.parameter_count());
  // Counted without building the model, so a file's or a flag's sizes can be weighed first;
  // a count past 64 bits is refused rather than wrapped.
  GptConfig huge = config;
  huge.layers = 1;
  huge.width = std::int64_t{1} << 31;  // 12 C^2 = 3 2^64
  EXPECT_THROW(nn::gpt_parameter_count(huge), std::invalid_argument);
  huge.width = 384;
  huge.context = std::numeric_limits<std::int64_t>::max() / 384;  // wpe fits, wte + wpe does not
  EXPECT_THROW(nn::gpt_parameter_count(huge), std::invalid_argument);
}

/// The mean and standard deviation of a parameter's elements.
std::pair<double, double> moments(const Tensor& t) {
  const auto v = testing::to_doubles(t);
  double sum = 0, squares = 0;
  for (const double x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (const double x : v) squares += (x - mean) * (x - mean);
  return {mean, std::sqrt(squares / static_cast<double>(v.size()))};
}

// Weights and tables normal(0, 0.02), the residual projections 0.02 / sqrt(2 N), biases 0,
// LayerNorm 1 and 0. A sample of n normal values has a standard deviation within about
// 1/sqrt(2n) of the true one (relative) and a mean within std/sqrt(n): with n >= 98304 the 3%
// and 0.02-std bounds below are more than ten of those spreads.
TEST(GptParameters, InitialisationIsNanoGpts) {
  const GptConfig config{256, 256, 6, 384, 6, 0.0f, 1, nn::Precision::fp32};
  const Gpt model(config, Device::cpu());
  for (const nn::NamedParameter& p : model.parameters()) {
    const auto [mean, std] = moments(p.value);
    if (p.name.find(".ln_") != std::string::npos) {
      EXPECT_EQ(mean, p.name.ends_with("weight") ? 1.0 : 0.0) << p.name;
      EXPECT_EQ(std, 0.0) << p.name;
    } else if (p.name.ends_with(".bias")) {
      EXPECT_EQ(std::abs(mean) + std, 0.0) << p.name;
    } else {
      const double want = p.name.ends_with("c_proj.weight") ? 0.02 / std::sqrt(12.0) : 0.02;
      EXPECT_NEAR(std, want, 0.03 * want) << p.name;
      EXPECT_NEAR(mean, 0.0, 0.02 * want) << p.name;
    }
  }
}

// ---- gradients ------------------------------------------------------------------------------
//
// The float64 twin's gradients (backward, then complete_gradients for the tied head) against
// Richardson-extrapolated central differences of its loss, by every parameter element, with
// dropout on (the masks are fixed functions of the indices) and a padded sequence. The step
// and bound are NormalizationFiniteDifference's for sigma = 1: the inputs of every LayerNorm
// are O(1) vectors of 8 channels whose spread stays far above the step. The loss is O(1) and a
// few thousand f64 operations deep, each rounding at most 2^-53 relative on values O(10) at
// most: 1e-12 bounds its evaluation error with room to spare.
// Both attention kernels: the memory-efficient one rebuilds P from its rows' max and sum.
class GptGradients : public ::testing::TestWithParam<nn::AttentionKernel> {};

TEST_P(GptGradients, Float64BackwardIsTheDerivativeOfTheLoss) {
  GptConfig config{7, 6, 2, 8, 2, 0.2f, 3, nn::Precision::fp32};
  config.attention = GetParam();
  Gpt model = Gpt::float64(config);
  const Sequences s = random_sequences({5, 3}, 5, config.vocabulary, 9);
  const float count = static_cast<float>(s.real_targets());
  model.zero_grad();
  forward_backward(model, s, 4, count, 17);
  model.complete_gradients();
  const testing::NormalizationFiniteDifference fd(1.0);
  const auto loss = [&] {
    const Tensor tokens = Tensor::from_vector(s.tokens, {s.b, s.T});
    const Tensor targets = Tensor::from_vector(s.targets, {s.b * s.T});
    ForwardContext context;
    context.dropout_seed = 17;
    context.first_row = 4;
    const Tensor logits = model.forward(tokens, context);
    const Tensor total = Tensor::zeros({1}, DType::f64);
    cross_entropy_forward(logits, targets, total, count);
    return testing::to_doubles(total)[0];
  };
  std::int64_t checked = 0;
  for (const nn::NamedParameter& p : model.parameters()) {
    const std::vector<double> analytic = testing::to_doubles(p.grad);
    double* values = p.value.data<double>();
    for (std::int64_t k = 0; k < p.value.numel(); ++k) {
      const double numeric = fd.derivative(loss, values[k]);
      EXPECT_NEAR(analytic[k], numeric, fd.tolerance(1e-12, analytic[k])) << p.name << " " << k;
      ++checked;
    }
  }
  EXPECT_EQ(checked, model.parameter_count());
}

std::string kernel_test_name(const ::testing::TestParamInfo<nn::AttentionKernel>& info) {
  return nn::attention_kernel_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Kernels, GptGradients,
                         ::testing::Values(nn::AttentionKernel::plain,
                                           nn::AttentionKernel::efficient),
                         kernel_test_name);

// Every dropout of a step draws from a stream of its own (tests/dropout_sites.hpp): the
// embeddings' and, per block, the attention probabilities', the attention residual's and the
// MLP residual's, with either attention kernel.
class GptDropout : public ::testing::TestWithParam<nn::AttentionKernel> {};

TEST_P(GptDropout, EverySiteOfAStepDrawsFromAStreamOfItsOwn) {
  GptConfig config{13, 6, 3, 8, 2, 0.1f, 3, nn::Precision::fp32};
  config.attention = GetParam();
  Gpt model(config, Device::cpu());
  const Sequences s = random_sequences({6, 4}, 6, config.vocabulary, 9);
  std::vector<DropoutSpec> drawn;
  model.zero_grad();
  forward_backward(model, s, 5, static_cast<float>(s.real_targets()), 17, 1.0f, &drawn);
  testing::expect_independent_dropout_sites(drawn, 1 + 3 * config.layers, config.dropout, 17, 5);
}

INSTANTIATE_TEST_SUITE_P(Kernels, GptDropout,
                         ::testing::Values(nn::AttentionKernel::plain,
                                           nn::AttentionKernel::efficient),
                         kernel_test_name);

// Five sequences of uneven lengths (padding ignored), run as one batch and as micro-batches
// of 2, 1 and 2 sequences with the step's global target count: every gradient, the tied
// wte's included, is the batch's bit for bit, in fp32 and in bf16, dropout on, with either
// attention kernel.
TEST(GptAccumulation, MicroBatchesOfSequencesGiveTheBatchGradientsBitForBit) {
  for (const nn::AttentionKernel kernel :
       {nn::AttentionKernel::plain, nn::AttentionKernel::efficient}) {
  for (const nn::Precision precision : {nn::Precision::fp32, nn::Precision::bf16}) {
    SCOPED_TRACE(nn::precision_name(precision) + ", " + nn::attention_kernel_name(kernel));
    GptConfig config{11, 8, 2, 12, 3, 0.1f, 5, precision};
    config.attention = kernel;
    const Sequences s = random_sequences({8, 3, 6, 1, 7}, 8, config.vocabulary, 21);
    const float count = static_cast<float>(s.real_targets());
    Gpt batch(config, Device::cpu()), micro(config, Device::cpu());
    batch.zero_grad();
    forward_backward(batch, s, 0, count, 33);
    batch.complete_gradients();
    micro.zero_grad();
    std::int64_t first = 0;
    for (const std::int64_t size : {2, 1, 2}) {
      forward_backward(micro, s.slice(first, size), first, count, 33);
      first += size;
    }
    micro.complete_gradients();
    const auto want = batch.parameters(), got = micro.parameters();
    for (std::size_t k = 0; k < want.size(); ++k) {
      EXPECT_TRUE(testing::bitwise_equal(got[k].grad, want[k].grad)) << want[k].name;
    }
  }
  }
}

// The accumulation bug of 2024 (Hugging Face transformers, PR #34191): each micro-batch's loss
// divided by its own count of target tokens n_m (and by the M micro-batches), instead of
// every target by the step's count N. Cross-entropy's gradient is linear in 1/count, so that
// run gives sum_m w_m g_m with w_m = N / (M n_m), where g_m is micro-batch m's gradient with
// the global count: micro-batches with few tokens weigh more than their tokens. Checked on
// the float64 twin, where both identities hold to rounding (a few thousand f64 operations,
// relative 1e-12 with room to spare), and the error is far from rounding (over 5% here).
TEST(GptAccumulation, PerMicroBatchMeansMisweightUnevenTokenCounts) {
  const GptConfig config{256, 16, 1, 8, 2, 0.0f, 11, nn::Precision::fp32};
  const TokenSequences data = bigbatch::make_sequences(synthetic_documents(6, 2, 17, 5), 16);
  ASSERT_EQ(data.count(), 6);
  const std::int64_t M = 3, per = 2, N = data.real_targets();
  const auto slice = [&](std::int64_t m) {
    Sequences s{per, data.length, {}, {}};
    const auto first = data.tokens.begin() + m * per * data.length;
    s.tokens.assign(first, first + per * data.length);
    const auto target = data.targets.begin() + m * per * data.length;
    s.targets.assign(target, target + per * data.length);
    return s;
  };
  const auto gradients = [&](Gpt& model) {
    model.complete_gradients();
    std::vector<double> all;
    for (const nn::NamedParameter& p : model.parameters()) {
      const auto g = testing::to_doubles(p.grad);
      all.insert(all.end(), g.begin(), g.end());
    }
    model.zero_grad();
    return all;
  };
  Gpt model = Gpt::float64(config);
  model.zero_grad();
  std::vector<std::vector<double>> parts;  // g_m: micro-batch m alone, global count
  std::vector<double> weights;             // w_m = N / (M n_m)
  for (std::int64_t m = 0; m < M; ++m) {
    forward_backward(model, slice(m), m * per, static_cast<float>(N), 1);
    parts.push_back(gradients(model));
    weights.push_back(static_cast<double>(N) /
                      static_cast<double>(M * data.real_targets(m * per, (m + 1) * per)));
  }
  for (std::int64_t m = 0; m < M; ++m) {
    forward_backward(model, slice(m), m * per, static_cast<float>(N), 1);
  }
  const std::vector<double> right = gradients(model);
  for (std::int64_t m = 0; m < M; ++m) {
    const std::int64_t own = data.real_targets(m * per, (m + 1) * per);
    forward_backward(model, slice(m), m * per, static_cast<float>(M * own), 1);
  }
  const std::vector<double> wrong = gradients(model);
  double error = 0, norm = 0, magnitude = 0;
  for (std::size_t k = 0; k < right.size(); ++k) {
    double sum = 0, weighted = 0;
    for (std::int64_t m = 0; m < M; ++m) {
      sum += parts[m][k];
      weighted += weights[m] * parts[m][k];
      magnitude = std::max(magnitude, weights[m] * std::abs(parts[m][k]));
    }
    EXPECT_NEAR(right[k], sum, 1e-12 * (magnitude + 1e-300)) << k;
    EXPECT_NEAR(wrong[k], weighted, 1e-12 * (magnitude + 1e-300)) << k;
    error += (wrong[k] - right[k]) * (wrong[k] - right[k]);
    norm += right[k] * right[k];
  }
  EXPECT_GT(std::sqrt(error / norm), 0.05) << "the per-micro-batch mean should be visibly wrong";
}

// 16-bit gradients against fp32's for the same model (the same f32 masters) and data. Not
// derived, as for the MLP (test_mixed_precision.cpp): every activation is rounded to the
// working type (unit roundoff u: fp16 2^-11, bf16 2^-8) at each of the ~30 ops on a block's
// path, and how those errors grow through the backward is not bounded here. Assumed: the
// error is first order in u, so c = (||g16 - g32|| / ||g32||) / u, worst over the parameter
// tensors, is about the same for both types. Measured here: c = 2.6 for fp16 and 2.8 for
// bf16. Checked at c < 60 (a margin over 20x), where a wrong gradient gives about 1 / u. fp16
// runs with a loss scale of 2^10 (divided out exactly), as chapter 03 prescribes, so that no
// gradient flushes to zero.
TEST(GptMixedPrecision, GradientsFollowFp32ByAMultipleOfTheUnitRoundoff) {
  const Sequences s = random_sequences({10, 4, 9, 10}, 10, 61, 71);
  const float count = static_cast<float>(s.real_targets());
  const auto run = [&](nn::Precision precision, float loss_scale) {
    Gpt model(GptConfig{61, 10, 2, 32, 4, 0.1f, 13, precision}, Device::cpu());
    model.zero_grad();
    forward_backward(model, s, 0, count, 5, loss_scale);
    model.complete_gradients();
    std::vector<std::vector<double>> gradients;
    for (const nn::NamedParameter& p : model.parameters()) {
      gradients.push_back(testing::to_doubles(p.grad));
      for (double& g : gradients.back()) g /= loss_scale;
    }
    return gradients;
  };
  const auto reference = run(nn::Precision::fp32, 1.0f);
  for (const auto& [precision, loss_scale] :
       {std::pair{nn::Precision::fp16, 1024.0f}, std::pair{nn::Precision::bf16, 1.0f}}) {
    const auto gradients = run(precision, loss_scale);
    const double u = testing::unit_roundoff(nn::working_dtype(precision));
    double worst = 0;
    for (std::size_t k = 0; k < reference.size(); ++k) {
      double difference = 0, norm = 0;
      for (std::size_t e = 0; e < reference[k].size(); ++e) {
        difference += std::pow(gradients[k][e] - reference[k][e], 2);
        norm += std::pow(reference[k][e], 2);
      }
      ASSERT_GT(norm, 0.0) << "parameter " << k << " has no gradient to compare";
      const double ratio = std::sqrt(difference / norm) / u;
      if (!(ratio <= worst)) worst = ratio;  // a NaN gradient makes worst NaN, and fails
    }
    std::printf("%s: worst ||g16 - g32|| / ||g32|| = %.2f u\n",
                nn::precision_name(precision).c_str(), worst);
    EXPECT_LT(worst, 60) << nn::precision_name(precision);
  }
}

// Changing the token at position t changes no logit before t, bit for bit, through every
// layer of the model (the attention's mask, and nothing else mixing positions).
TEST(GptModel, ForwardIsCausal) {
  const GptConfig config{13, 9, 2, 8, 2, 0.0f, 7, nn::Precision::fp32};
  Gpt model(config, Device::cpu());
  Sequences s = random_sequences({9}, 9, config.vocabulary, 41);
  ForwardContext inference;
  inference.training = false;
  const auto logits = [&] {
    return testing::to_doubles(
        model.forward(Tensor::from_vector(s.tokens, {1, 9}), inference));
  };
  const std::vector<double> before = logits();
  s.tokens[6] = (s.tokens[6] + 1) % 13;
  const std::vector<double> after = logits();
  for (std::size_t k = 0; k < before.size(); ++k) {
    const std::size_t position = k / 13;
    if (position < 6) {
      EXPECT_EQ(after[k], before[k]) << "position " << position;
    }
  }
  EXPECT_NE(std::vector<double>(after.begin() + 6 * 13, after.begin() + 7 * 13),
            std::vector<double>(before.begin() + 6 * 13, before.begin() + 7 * 13));
}

// ---- memory ---------------------------------------------------------------------------------

// A training forward keeps exactly gpt_saved_bytes' activations, to the byte, in fp32, fp16
// and bf16, with and without dropout (no mask is kept), with either attention kernel, and an
// inference forward only its logits.
TEST(GptMemory, ForwardKeepsThePredictedBytes) {
  for (const nn::AttentionKernel kernel :
       {nn::AttentionKernel::plain, nn::AttentionKernel::efficient}) {
  for (const nn::Precision precision :
       {nn::Precision::fp32, nn::Precision::fp16, nn::Precision::bf16}) {
    for (const float dropout : {0.0f, 0.1f}) {
      SCOPED_TRACE(nn::precision_name(precision) + (dropout > 0 ? " with dropout, " : ", ") +
                   nn::attention_kernel_name(kernel));
      GptConfig config{256, 12, 3, 16, 4, dropout, 2, precision};
      config.attention = kernel;
      Gpt model(config, Device::cpu());
      const Sequences s = random_sequences({12, 7, 12}, 12, 256, 3);
      const Tensor tokens = Tensor::from_vector(s.tokens, {3, 12});
      const auto live = [] {
        return allocator_for(Device::cpu()).stats().live_of(MemoryCategory::activations);
      };
      const std::size_t before = live();
      Tensor logits = model.forward(tokens, ForwardContext{});
      EXPECT_EQ(live() - before, nn::gpt_saved_bytes(config, 3, 12).total(config.layers));
      ForwardContext inference;
      inference.training = false;
      logits = model.forward(tokens, inference);  // replaces what training saved
      EXPECT_EQ(live() - before, logits.nbytes());
    }
  }
  }
}

// Per block in 16 bits, against Korthikanti et al.'s 34 s b h + 5 a s^2 b (s = T, h = C,
// a = heads): ours is that less their three dropout masks (one byte an element: both
// residual branches' s b h and the attention's a s^2 b) and the dropped probabilities
// (2 a s^2 b), plus our four LayerNorm statistics (16 s b).
TEST(GptMemory, ABlockKeepsKorthikantisCountLessWhatTheCounterRngRecomputes) {
  const std::int64_t s = 256, b = 4, h = 384, a = 6;
  const GptConfig config{256, s, 6, h, a, 0.1f, 1, nn::Precision::bf16};
  const std::int64_t korthikanti = 34 * s * b * h + 5 * a * s * s * b;
  const std::int64_t masks = 2 * s * b * h + a * s * s * b, dropped = 2 * a * s * s * b;
  EXPECT_EQ(static_cast<std::int64_t>(nn::gpt_saved_bytes(config, b, s).per_block),
            korthikanti - masks - dropped + 16 * s * b);
  // Memory-efficient attention keeps no a s^2 b term at all: two f32 (its max and sum) for
  // each of the a s b query rows in place of P's 2 a s^2 b bytes.
  GptConfig efficient = config;
  efficient.attention = nn::AttentionKernel::efficient;
  EXPECT_EQ(static_cast<std::int64_t>(nn::gpt_saved_bytes(efficient, b, s).per_block),
            korthikanti - masks - dropped - 2 * a * s * s * b + 8 * a * s * b + 16 * s * b);
}

// Selective attention recomputation drops P; memory-efficient attention has none to drop.
TEST(GptModel, EfficientAttentionRefusesToDropProbabilities) {
  GptConfig config{16, 4, 1, 8, 2, 0.0f, 1, nn::Precision::fp32};
  config.attention = nn::AttentionKernel::efficient;
  Gpt model(config, Device::cpu());
  nn::GptBlockActivations saved;
  const Tensor x = Tensor::zeros({1, 4, 8}, DType::f32);
  EXPECT_THROW(model.block_forward(0, x, ForwardContext{}, saved,
                                   nn::BlockKeep::all_but_probabilities),
               std::invalid_argument);
  EXPECT_NO_THROW(model.block_forward(0, x, ForwardContext{}, saved, nn::BlockKeep::all));
  EXPECT_TRUE(saved.row_stats.defined());
  EXPECT_FALSE(saved.probabilities.defined());
}

TEST(GptModel, SaveAndLoadRoundTripEveryParameter) {
  const GptConfig config{13, 9, 1, 8, 2, 0.0f, 7, nn::Precision::bf16};
  const Gpt saved(config, Device::cpu());
  const testing::TemporaryPath file("gpt.safetensors");
  saved.save(file.str());
  GptConfig other = config;
  other.seed = 8;
  Gpt loaded(other, Device::cpu());
  loaded.load(file.str());
  const auto want = saved.parameters(), got = loaded.parameters();
  for (std::size_t k = 0; k < want.size(); ++k) {
    EXPECT_TRUE(testing::bitwise_equal(got[k].value, want[k].value)) << want[k].name;
    if (want[k].half.defined()) {
      EXPECT_TRUE(testing::bitwise_equal(got[k].half, want[k].half)) << want[k].name;
    }
  }
}

TEST(GptModel, RefusesWhatDoesNotFit) {
  EXPECT_THROW(Gpt(GptConfig{13, 9, 1, 8, 3, 0.0f, 7, nn::Precision::fp32}, Device::cpu()),
               std::invalid_argument);  // 3 heads do not divide 8 channels
  Gpt model(GptConfig{13, 9, 1, 8, 2, 0.0f, 7, nn::Precision::fp32}, Device::cpu());
  EXPECT_THROW(model.forward(Tensor::zeros({1, 10}, DType::i32), ForwardContext{}),
               std::invalid_argument);  // longer than the context
  EXPECT_THROW(model.forward(Tensor::from_vector(std::vector<std::int32_t>{13}, {1, 1}),
                             ForwardContext{}),
               std::invalid_argument);  // token outside the vocabulary
  EXPECT_THROW(model.backward(Tensor::zeros({1, 13}, DType::f32)), std::invalid_argument);
}

}  // namespace
}  // namespace bigbatch
