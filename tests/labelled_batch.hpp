// labelled_batch.hpp: a random batch for a model's tests: features uniform in [-2, 2]
// (f32, [rows, inputs]) and labels drawn from the counter-based RNG (i32, [rows]), a pure
// function of (config, rows, seed).
#pragma once

#include <cstdint>
#include <vector>

#include "common/rng.hpp"
#include "nn/model.hpp"
#include "tests/harness.hpp"

namespace bigbatch::testing {

struct LabelledBatch {
  Tensor x, labels;
};

inline LabelledBatch random_labelled_batch(const nn::ModelConfig& config, std::int64_t rows,
                                           std::uint64_t seed) {
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    labels[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(random_bits(seed, 1, i) % config.classes);
  }
  return {random_tensor({rows, config.inputs}, DType::f32, Device::cpu(), seed, -2.0, 2.0),
          Tensor::from_vector(labels, {rows}, Device::cpu(), MemoryCategory::data)};
}

}  // namespace bigbatch::testing
