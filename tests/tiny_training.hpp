// tiny_training.hpp: the small data set and model of the trainer's tests: 12 features,
// 5 classes labelled by a fixed random teacher (common/data), and a residual MLP of width
// 16 that trains in milliseconds.
#pragma once

#include <cstdint>

#include "common/data/dataset.hpp"
#include "nn/model.hpp"

namespace bigbatch::testing {

inline Dataset tiny_data(std::int64_t samples) {
  SyntheticOptions options;
  options.samples = samples;
  options.features = 12;
  options.classes = 5;
  options.teacher_hidden = 8;
  return make_synthetic(options);
}

inline nn::ModelConfig tiny_model(std::int64_t depth, float dropout) {
  return {.inputs = 12, .hidden = 16, .expansion = 2, .classes = 5, .depth = depth,
          .dropout = dropout, .seed = 7};
}

}  // namespace bigbatch::testing
