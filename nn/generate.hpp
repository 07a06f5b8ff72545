// generate.hpp: what a trained GPT writes. Tokens are drawn one at a time from the model's
// distribution of the next token, and each joins the context of the next draw:
//
//   context = prompt
//   n times:
//     logits = the last position's logits of model.forward(the last <= T tokens of context)
//              in inference (no dropout), T the model's context
//     next   = argmax logits                          temperature 0: greedy (lowest on a tie)
//            = a draw from softmax(logits / t)        temperature t > 0
//     context += next
//
// Draw k (0-based) reads random_uniform(seed, 0, k) (common/rng.hpp): the same seed, model
// and device give the same text on every machine. The softmax of a draw is taken in double
// on the host, from the largest logit down, so no temperature overflows it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/gpt.hpp"

namespace bigbatch::nn {

/// How generate() draws its tokens.
struct SamplingOptions {
  std::int64_t tokens = 200;  ///< n, the tokens to draw
  float temperature = 0.8f;   ///< 0: greedy; else the softmax's temperature (> 0)
  std::uint64_t seed = 0;     ///< the draws' seed
};

/// The token a draw picks from `logits` (one position's, over the vocabulary): the first
/// largest at temperature 0, else the first index whose cumulative probability of
/// softmax(logits / temperature) exceeds `uniform` (in [0, 1)). Throws
/// std::invalid_argument for no logits, a negative or non-finite temperature, or a logit
/// that is NaN.
std::int32_t sample_token(const std::vector<float>& logits, float temperature, float uniform);

/// The n tokens the model writes after `prompt` (token ids in [0, V), at least one), as
/// above. Throws std::invalid_argument for an empty prompt, a token outside the vocabulary
/// or a negative count.
std::vector<std::int32_t> generate(Gpt& model, const std::vector<std::int32_t>& prompt,
                                   const SamplingOptions& options);

/// The same draws, each handed to `take` as it is drawn, and kept nowhere: the memory is
/// the model's context's, whatever n. Stops after a token `take` returns false for.
/// Returns the tokens drawn (n, or fewer when `take` stopped it).
std::int64_t generate(Gpt& model, const std::vector<std::int32_t>& prompt,
                      const SamplingOptions& options,
                      const std::function<bool(std::int32_t)>& take);

}  // namespace bigbatch::nn
