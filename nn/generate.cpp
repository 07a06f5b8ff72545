// generate.cpp: drawing tokens from the GPT, one at a time.
#include "nn/generate.hpp"

#include <algorithm>
#include <cmath>

#include "common/check.hpp"
#include "common/rng.hpp"

namespace bigbatch::nn {

std::int32_t sample_token(const std::vector<float>& logits, float temperature, float uniform) {
  BIGBATCH_CHECK(!logits.empty(), "sample_token: no logits");
  BIGBATCH_CHECK(temperature >= 0.0f && std::isfinite(temperature),
                 "sample_token: the temperature must be finite and >= 0, got ", temperature);
  BIGBATCH_CHECK(std::none_of(logits.begin(), logits.end(), [](float l) { return std::isnan(l); }),
                 "sample_token: a logit is NaN");
  const auto largest = std::max_element(logits.begin(), logits.end());  // the first largest
  if (temperature == 0.0f) return static_cast<std::int32_t>(largest - logits.begin());
  // exp((l - max) / t) <= 1: no overflow at any temperature, and the largest term is 1.
  std::vector<double> weights(logits.size());
  double total = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[i]) - *largest) / temperature);
    total += weights[i];
  }
  const double target = static_cast<double>(uniform) * total;
  double cumulative = 0.0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    cumulative += weights[i];
    if (cumulative > target) return static_cast<std::int32_t>(i);
  }
  // Rounding can leave the cumulative sum a hair below uniform * total for uniform near 1:
  // the last token with any weight is the draw then.
  for (std::size_t i = weights.size(); i-- > 0;) {
    if (weights[i] > 0.0) return static_cast<std::int32_t>(i);
  }
  return static_cast<std::int32_t>(largest - logits.begin());
}

std::vector<std::int32_t> generate(Gpt& model, const std::vector<std::int32_t>& prompt,
                                   const SamplingOptions& options) {
  std::vector<std::int32_t> written;
  generate(model, prompt, options, [&written](std::int32_t token) {
    written.push_back(token);
    return true;
  });
  return written;
}

std::int64_t generate(Gpt& model, const std::vector<std::int32_t>& prompt,
                      const SamplingOptions& options,
                      const std::function<bool(std::int32_t)>& take) {
  const GptConfig& config = model.config();
  BIGBATCH_CHECK(!prompt.empty(), "generate: the prompt needs at least one token");
  BIGBATCH_CHECK(options.tokens >= 0, "generate: the tokens to draw must be >= 0, got ",
                 options.tokens);
  for (const std::int32_t token : prompt) {
    BIGBATCH_CHECK(0 <= token && token < config.vocabulary, "generate: the prompt's token ",
                   token, " is outside the vocabulary [0, ", config.vocabulary, ")");
  }
  std::vector<std::int32_t> context = prompt;
  const ForwardContext inference{/*training=*/false, 0, 0};
  for (std::int64_t k = 0; k < options.tokens; ++k) {
    // Only the last T tokens are read again: at 2T tokens, all but those go.
    if (static_cast<std::int64_t>(context.size()) >= 2 * config.context) {
      context.erase(context.begin(), context.end() - config.context);
    }
    const auto length =
        std::min<std::int64_t>(static_cast<std::int64_t>(context.size()), config.context);
    const std::vector<std::int32_t> window(context.end() - length, context.end());
    const Tensor tokens = Tensor::from_vector(window, {1, length}, model.device());
    const Tensor logits = model.forward(tokens, inference);  // [length, V]
    const std::vector<float> last = logits.rows(length - 1, length).to_vector<float>();
    const std::int32_t next = sample_token(
        last, options.temperature, random_uniform(options.seed, 0, static_cast<std::uint64_t>(k)));
    context.push_back(next);
    if (!take(next)) return k + 1;
  }
  return options.tokens;
}

}  // namespace bigbatch::nn
