// memory_model.cpp: the byte counts of memory_model.hpp.
#include "nn/memory_model.hpp"

#include "common/check.hpp"

namespace bigbatch::nn {

PredictedBytes predict_memory(const ModelConfig& c, std::int64_t rows) {
  BIGBATCH_CHECK(c.norm == Norm::layer, "predict_memory: only LayerNorm models are modelled");
  BIGBATCH_CHECK(rows >= 0, "predict_memory: rows must be >= 0, got ", rows);
  const bool mixed = c.precision == Precision::fp16;
  const std::int64_t d = c.inputs, h = c.hidden, inner = c.expansion * c.hidden, k = c.classes;
  const std::int64_t weights = d * h + c.depth * 2 * h * inner + h * k;  // Linear weights
  // Linear biases (stem, fc1, fc2, head) and LayerNorm weight and bias (blocks, head).
  const std::int64_t others = h + c.depth * (inner + h + 2 * h) + k + 2 * h;
  PredictedBytes p;
  p.parameters =
      static_cast<std::size_t>(mixed ? 2 * weights + 4 * others : 4 * (weights + others));
  p.master_weights = static_cast<std::size_t>(mixed ? 4 * weights : 0);
  p.gradients = static_cast<std::size_t>(4 * (weights + others));
  p.adamw_state = 2 * p.gradients;
  const std::int64_t s = mixed ? 2 : 4;
  const std::int64_t per_sample = 2 * h * s + c.depth * ((2 * h + 2 * inner) * s + 8) +
                                  h * s + 8 + 4 * k + (mixed ? 2 * d : 0);
  p.activations = static_cast<std::size_t>(rows * per_sample);
  return p;
}

}  // namespace bigbatch::nn
