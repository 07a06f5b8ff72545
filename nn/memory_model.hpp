// memory_model.hpp: the bytes a training step of the model needs, predicted from its
// configuration alone, category by category (common/memory.hpp). Tests and chapter demos
// hold these predictions against the tracking allocator's counts, to the byte.
//
//   parameters       Linear weights: 4 bytes each (fp32), or 2 (fp16: the working copy);
//                    biases and norm weights: 4 bytes each; BatchNorm's running statistics
//   master_weights   fp16 only: the Linear weights' f32 masters, 4 bytes each
//   gradients        4 bytes per trainable parameter (f32 in both precisions)
//   adamw_state      AdamW's exp_avg and exp_avg_sq: 8 bytes per trainable parameter
//   activations      what forward() saves for backward() for `rows` samples, its peak (at
//                    the end of forward): per sample, with s the activations' element size
//                    (4 fp32, 2 fp16): the stem's pre-activation and output (2H s); per block
//                    the normed input, fc1's output, the hidden layer after dropout and the
//                    block's output ((2H + 2EH) s) and LayerNorm's mean and rstd (8); the
//                    head's normed input (H s) and statistics (8); the logits (4C, f32 in
//                    both); under fp16 also the input rounded to f16 (2D). LayerNorm only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nn/model.hpp"

namespace bigbatch::nn {

struct PredictedBytes {
  std::size_t parameters = 0, master_weights = 0, gradients = 0, adamw_state = 0;
  std::size_t activations = 0;  ///< saved by one forward() of `rows` samples
};

/// The prediction for a model of this configuration and a forward pass of `rows` samples.
/// Throws std::invalid_argument for BatchNorm (its statistics are per feature, not per
/// sample: not modelled yet).
PredictedBytes predict_memory(const ModelConfig& config, std::int64_t rows);

}  // namespace bigbatch::nn
