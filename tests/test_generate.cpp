// test_generate.cpp: what a GPT writes (nn/generate.hpp): the sampler's greedy choice and its
// draws against the softmax's probabilities, and generate() against the same loop written
// out with the model's forward, the context window sliding once the text outgrows it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "common/rng.hpp"
#include "nn/generate.hpp"
#include "nn/gpt.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using nn::sample_token;

TEST(SampleToken, GreedyTakesTheFirstLargestLogit) {
  EXPECT_EQ(sample_token({0.5f, 2.0f, -1.0f, 2.0f}, 0.0f, 0.99f), 1);
  EXPECT_EQ(sample_token({-3.0f}, 0.0f, 0.0f), 0);
}

/// How often each token is drawn in `draws` draws of the counter RNG's uniforms.
std::vector<double> frequencies(const std::vector<float>& logits, float temperature, int draws) {
  std::vector<double> counts(logits.size(), 0.0);
  for (int k = 0; k < draws; ++k) {
    counts[static_cast<std::size_t>(sample_token(logits, temperature, random_uniform(9, 0, k)))] += 1;
  }
  for (double& c : counts) c /= draws;
  return counts;
}

TEST(SampleToken, DrawsFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f)};
  constexpr int kDraws = 6000;
  // At temperature 1 the probabilities are 1/6, 2/6, 3/6; at 0.5 the weights square: 1/14,
  // 4/14, 9/14. A frequency of n draws has standard deviation sqrt(p (1 - p) / n) <= 0.0065;
  // 4 of them (0.026) is a bound a correct sampler passes (the draws are fixed by the seed,
  // so this is not flaky) and a sampler off by a temperature or a token does not.
  const std::vector<std::vector<double>> want = {{1 / 6.0, 2 / 6.0, 3 / 6.0},
                                                 {1 / 14.0, 4 / 14.0, 9 / 14.0}};
  const float temperatures[] = {1.0f, 0.5f};
  for (int t = 0; t < 2; ++t) {
    const std::vector<double> got = frequencies(logits, temperatures[t], kDraws);
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[t][i], 0.026) << "temperature " << temperatures[t] << ", token " << i;
    }
  }
}

TEST(SampleToken, TheEndsOfTheUniformAndHugeLogits) {
  EXPECT_EQ(sample_token({1.0f, 1.0f, 1.0f}, 1.0f, 0.0f), 0);
  EXPECT_EQ(sample_token({1.0f, 1.0f, 1.0f}, 1.0f, 1.0f - 0x1p-24f), 2);
  // exp(1e30 / 1e-3) would overflow; taken from the largest down it is 1, the rest 0.
  EXPECT_EQ(sample_token({-1e30f, 1e30f, 0.0f}, 1e-3f, 0.999f), 1);
  EXPECT_THROW(sample_token({}, 1.0f, 0.5f), std::invalid_argument);
  EXPECT_THROW(sample_token({1.0f}, -1.0f, 0.5f), std::invalid_argument);
  EXPECT_THROW(sample_token({std::numeric_limits<float>::quiet_NaN()}, 1.0f, 0.5f),
               std::invalid_argument);
}

/// A small GPT whose parameters are nanoGPT's initialisation times 4 (std 0.08): its logits
/// differ by about a unit from one context to another, so which tokens it reads changes what
/// it writes. At nanoGPT's std 0.02 they are nearly equal whatever the context (a draw would
/// hardly see a wrong window), and at 10 times more the model saturates into one token
/// whatever the seed.
nn::Gpt tiny_gpt() {
  nn::Gpt model({.vocabulary = 16, .context = 4, .layers = 1, .width = 8, .heads = 2,
                 .dropout = 0.1f, .seed = 4},
                Device::cpu());
  for (const nn::NamedParameter& p : model.parameters()) {
    std::vector<float> values = p.value.to_vector<float>();
    for (float& v : values) v *= 4.0f;
    Tensor(p.value).copy_from(Tensor::from_vector(values, p.value.shape()));
  }
  return model;
}

/// generate() written out: the last <= 4 tokens' forward, the last row, the sampler.
std::vector<std::int32_t> by_hand(nn::Gpt& model, std::vector<std::int32_t> context,
                                  const nn::SamplingOptions& options) {
  std::vector<std::int32_t> written;
  for (std::int64_t k = 0; k < options.tokens; ++k) {
    const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(context.size()), 4);
    const std::vector<std::int32_t> window(context.end() - n, context.end());
    const Tensor logits =
        model.forward(Tensor::from_vector(window, {1, n}), nn::ForwardContext{false, 0, 0});
    const std::vector<float> all = logits.to_vector<float>();
    const std::vector<float> last(all.end() - 16, all.end());
    const std::int32_t next = sample_token(
        last, options.temperature, random_uniform(options.seed, 0, static_cast<std::uint64_t>(k)));
    context.push_back(next);
    written.push_back(next);
  }
  return written;
}

TEST(Generate, IsTheLoopWrittenOutAndSlidesItsWindowPastTheContext) {
  nn::Gpt model = tiny_gpt();
  // 3 prompt tokens and 14 drawn: from the second draw on the text outgrows the context of
  // 4, and generate() drops what it will not read again three times (each time it holds 8).
  for (const float temperature : {0.0f, 1.0f}) {
    SCOPED_TRACE(temperature);
    const nn::SamplingOptions options{.tokens = 14, .temperature = temperature, .seed = 3};
    const std::vector<std::int32_t> written = nn::generate(model, {5, 1, 9}, options);
    ASSERT_EQ(written.size(), 14u);
    EXPECT_EQ(written, by_hand(model, {5, 1, 9}, options));
  }
}

TEST(Generate, HandsEachTokenOverAsDrawnAndStopsWhenTold) {
  nn::Gpt model = tiny_gpt();
  const nn::SamplingOptions options{.tokens = 12, .temperature = 1.0f, .seed = 5};
  const std::vector<std::int32_t> whole = nn::generate(model, {5, 1, 9}, options);
  std::vector<std::int32_t> taken;
  const std::int64_t drawn = nn::generate(model, {5, 1, 9}, options, [&](std::int32_t token) {
    taken.push_back(token);
    return taken.size() < 5;  // "stop" with the fifth
  });
  EXPECT_EQ(drawn, 5);
  EXPECT_EQ(taken, std::vector<std::int32_t>(whole.begin(), whole.begin() + 5));
}

TEST(Generate, OnlyTheLastContextLengthOfTokensIsRead) {
  nn::Gpt model = tiny_gpt();
  // The same last 4 tokens behind different beginnings: the same text after them.
  for (const float temperature : {0.0f, 1.0f}) {
    SCOPED_TRACE(temperature);
    const nn::SamplingOptions options{.tokens = 6, .temperature = temperature, .seed = 8};
    EXPECT_EQ(nn::generate(model, {5, 1, 9, 2, 7, 3}, options),
              nn::generate(model, {12, 14, 0, 9, 2, 7, 3}, options));
  }
}

TEST(Generate, TheSeedChoosesTheDrawsAndGreedyIgnoresIt) {
  nn::Gpt model = tiny_gpt();
  const auto with = [&](float temperature, std::uint64_t seed) {
    return nn::generate(model, {2, 3}, {.tokens = 12, .temperature = temperature, .seed = seed});
  };
  EXPECT_EQ(with(1.0f, 1), with(1.0f, 1));
  EXPECT_NE(with(1.0f, 1), with(1.0f, 2));  // 12 draws among 16 tokens: the seeds' differ
  EXPECT_EQ(with(0.0f, 1), with(0.0f, 2));
}

TEST(Generate, RefusesWhatItCannotRead) {
  nn::Gpt model = tiny_gpt();
  EXPECT_THROW(nn::generate(model, {}, {}), std::invalid_argument);
  EXPECT_THROW(nn::generate(model, {16}, {}), std::invalid_argument);
  EXPECT_THROW(nn::generate(model, {1}, {.tokens = -1}), std::invalid_argument);
  EXPECT_TRUE(nn::generate(model, {1}, {.tokens = 0}).empty());
}

}  // namespace
}  // namespace bigbatch
