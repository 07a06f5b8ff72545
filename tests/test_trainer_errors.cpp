// test_trainer_errors.cpp: the trainer's documented error paths (chapters/train/trainer.hpp).
// Without a loss scaler there is no scale to back off: an inf or NaN loss, or (when the
// boundary's pass runs, here for clipping) an inf or NaN gradient behind a finite loss,
// stops the run before the optimizer step, naming the step, and the weights are untouched.
#include <gtest/gtest.h>

#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "chapters/train/trainer.hpp"
#include "tests/harness.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

std::vector<std::vector<float>> parameter_values(const nn::Model& model) {
  std::vector<std::vector<float>> values;
  for (const nn::NamedParameter& p : model.parameters()) {
    values.push_back(p.value.to_vector<float>());
  }
  return values;
}

/// Writes `value` into every element of the model's tensor `name`, and `first` (when
/// given) into its element 0.
void set_all(const nn::Model& model, const std::string& name, float value,
             std::optional<float> first = std::nullopt) {
  for (auto [tensor_name, tensor] : model.state_dict()) {  // a view of the model's tensor
    if (tensor_name != name) continue;
    std::vector<float> values(static_cast<std::size_t>(tensor.numel()), value);
    if (first) values[0] = *first;
    tensor.copy_from(Tensor::from_vector(values, tensor.shape()));
    return;
  }
  FAIL() << "no tensor " << name;
}

/// Runs one step of SGD (batch 32, clipping at `clip`: 0 is off) on `model` and expects
/// it to stop with Error, whose message mentions `words`, before the weights are written.
template <class Error>
void expect_the_step_stops(nn::Model& model, float clip, std::initializer_list<std::string> words) {
  const Dataset data = testing::tiny_data(64);
  nn::Optimizer optimizer(model.parameters(), SgdOptions{.lr = 0.1});
  train::TrainConfig config;
  config.batch = 32;
  config.steps = 2;
  config.clip_grad_norm = clip;
  train::Trainer trainer(model, optimizer, data, config);
  const auto before = parameter_values(model);
  try {
    trainer.step();
    ADD_FAILURE() << "the step was taken without a loss scaler";
  } catch (const Error& e) {
    EXPECT_TRUE(testing::mentions(e.what(), words)) << e.what();
  }
  EXPECT_EQ(parameter_values(model), before) << "the weights were written";
}

TEST(TrainerErrors, AnInfGradientBehindAFiniteLossStopsARunWithoutAScaler) {
  nn::Model model(testing::tiny_model(0, 0.0f), Device::cpu());  // stem, head.ln, head
  // The stem outputs a constant (weight and bias 0), so the head's LayerNorm sees zero
  // variance: it outputs zeros, the logits are the head's bias (0) and the loss is log 5,
  // finite. Backward, its input gradient is 1/sqrt(eps) = 316 times its output gradient,
  // which the head's weight (3e38 at [0][0], 0 elsewhere) makes 3e38 dlogit_0: far past
  // the float range, so the stem's gradients are inf or NaN behind a finite loss.
  set_all(model, "stem.weight", 0.0f);
  set_all(model, "stem.bias", 0.0f);
  set_all(model, "head.weight", 0.0f, 3e38f);
  // Clipping makes the boundary's pass run, and it finds the inf.
  expect_the_step_stops<train::NonFiniteGradientError>(
      model, 1.0f,
      {"step 1: a gradient is inf or NaN", "the run stops before the weights are written"});
}

TEST(TrainerErrors, AnInfLossStopsARunWithoutAScaler) {
  nn::Model model(testing::tiny_model(1, 0.0f), Device::cpu());
  set_all(model, "head.bias", std::numeric_limits<float>::infinity());
  expect_the_step_stops<train::NonFiniteLossError>(model, 0.0f,
                                                   {"step 1 (epoch 0, batch 0): the loss is"});
}

}  // namespace
}  // namespace bigbatch
