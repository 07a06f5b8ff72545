// measure_step.hpp: one training step's memory (the MLP's, or the GPT's), measured by the
// tracking allocator, for the tests that hold a prediction (chapter 05's memory model,
// chapter 06's planner) against it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/train/trainer.hpp"
#include "common/data/text_corpus.hpp"
#include "common/memory.hpp"
#include "nn/gpt.hpp"
#include "nn/model.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"
#include "tests/labelled_batch.hpp"

namespace bigbatch::testing {

/// A step of the MLP of `model` as measure() runs it; shape() is chapter 05's view of it.
struct MlpStep {
  nn::ModelConfig model;
  std::int64_t batch = 0, micro_batch = 0;  ///< rows
  nn::Optimizer::Options optimizer;
  std::size_t boundary_bytes = 0;  ///< checkpointing::StepShape::boundary_bytes
  checkpointing::StepShape shape() const {
    return {std::make_shared<nn::ModelLedger>(model), batch, micro_batch, optimizer,
            boundary_bytes};
  }
};

/// A step of chapter 08's GPT of `model` on sequences of `length` positions, as
/// measure_gpt() runs it; shape() is chapter 05's view of it.
struct GptStep {
  nn::GptConfig model;
  std::int64_t batch = 0, micro_batch = 0;  ///< sequences
  std::int64_t length = 0;                  ///< positions per sequence
  nn::Optimizer::Options optimizer;
  std::size_t boundary_bytes = 0;  ///< checkpointing::StepShape::boundary_bytes
  checkpointing::StepShape shape() const {
    return {std::make_shared<nn::GptLedger>(model, length), batch, micro_batch, optimizer,
            boundary_bytes};
  }
};

struct Measured {
  MemoryStats stats;
  std::int64_t evaluations = -1, recomputations = -1;  // -1: no runner
};

/// One accumulate_gradients over a batch on the host, the peak reset just before it, as
/// predict_step describes the step (AdamW's state live, one micro-batch at a time copied
/// into an nn::MicroBatchBuffer on `device`; with step.boundary_bytes, the optimizer
/// boundary's pass results allocated as the trainer keeps them).
inline Measured measure(const MlpStep& step, const checkpointing::Policy& policy,
                        bool runner_for_none, Device device) {
  nn::Model model(step.model, device);
  nn::Optimizer optimizer(model.parameters(), step.optimizer);
  std::shared_ptr<checkpointing::ScheduledRunner> runner;
  if (policy.needs_runner() || runner_for_none) {
    runner = checkpointing::ScheduledRunner::for_policy(policy, step.model.depth);
    model.set_block_runner(runner);
  }
  // The batch on the host (MemoryCategory::host_data, outside the totals) and nothing
  // else live (the random batch's own tensors go before the step).
  Tensor x({step.batch, step.model.inputs}, DType::f32, Device::cpu(), MemoryCategory::host_data);
  Tensor labels({step.batch}, DType::i32, Device::cpu(), MemoryCategory::host_data);
  {
    const testing::LabelledBatch batch = random_labelled_batch(step.model, step.batch, 3);
    x.copy_from(batch.x);
    labels.copy_from(batch.labels);
  }
  nn::MicroBatchBuffer staging(std::min(step.micro_batch, step.batch), step.model.inputs, device);
  loss_scaling::UnscalePass boundary;  // chapter 04's results: found-inf and the squared norm
  if (step.boundary_bytes > 0) boundary.allocate(device, /*with_norm=*/true);
  TrackingAllocator& allocator = allocator_for(device);
  allocator.reset_peak();
  nn::accumulate_gradients(model, step.batch, staging.rows_of(x, labels), step.micro_batch,
                           {true, 11, 0});
  Measured m;
  m.stats = allocator.stats();
  if (runner) {
    m.evaluations = runner->evaluations();
    m.recomputations = runner->recomputations();
  }
  return m;
}

/// One optimizer step of chapter 08's GPT through the trainer (which resets the peak as
/// the step starts, and keeps the boundary's pass results when the step's boundary_bytes
/// say so: fp16 trains under the dynamic scaler then), on `step.batch` random documents
/// cut into sequences of `step.length` positions, in micro-batches of `step.micro_batch`
/// sequences: the step's books (what is live after it is the trainer's) and the block
/// forwards its runner counted.
inline Measured measure_gpt(const GptStep& step,
                            const checkpointing::Policy& policy, Device device) {
  const Dataset data = make_token_dataset(
      make_sequences(synthetic_documents(3 * step.batch, 2, 3 * step.length, /*seed=*/6),
                     step.length),
      "synthetic-text");
  nn::Gpt model(step.model, device);
  std::shared_ptr<checkpointing::GptScheduledRunner> runner;
  if (policy.needs_runner()) {
    runner = checkpointing::GptScheduledRunner::for_policy(policy, step.model.layers);
    model.set_block_runner(runner);
  }
  nn::Optimizer optimizer(model.parameters(), step.optimizer);
  train::TrainConfig train;
  train.batch = step.batch;
  train.micro_batch = step.micro_batch;
  train.steps = 1;
  if (step.boundary_bytes > 0) train.loss_scaling = train::LossScaling::dynamic;
  train::Trainer trainer(model, optimizer, data, train);
  Measured m;
  trainer.run([&](const train::StepRecord& record) { m.stats = record.memory; });
  if (runner) {
    m.evaluations = runner->evaluations();
    m.recomputations = runner->recomputations();
  }
  return m;
}

}  // namespace bigbatch::testing
