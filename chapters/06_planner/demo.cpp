// Chapter 06: the planner. Chapter 01's batch of 4096 does not fit its 48 MiB device; the
// planner lists the plans that do, picks the fastest by a cost model measured here, and
// the batch trains with it under the same cap, to the uncapped run's result. See README.md
// in this folder; --quick is the CTest setting.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/06_planner/planner.hpp"
#include "chapters/train/trainer.hpp"
#include "common/format.hpp"
#include "common/memory.hpp"
#include "common/report.hpp"

namespace bb = bigbatch;
namespace base = bigbatch::baseline;
namespace planning = bigbatch::planning;

namespace {

struct Outcome {
  bb::nn::EvaluationResult test;
  std::vector<std::vector<float>> parameters;  // after training, as floats
  std::size_t largest_step_peak = 0;           // the most device bytes of any step
  std::size_t boundary_bytes = 0;              // the optimizer boundary's own (a scaler's)
};

/// Trains chapter 01's model on `data` for `steps` steps of batch 4096 in micro-batches of
/// `micro`, with the plan's precision (fp16 with dynamic loss scaling) and checkpoint
/// policy, through the program's trainer (the step `bigbatch train --plan auto` runs),
/// which measures every step's peak on the (possibly capped) device.
Outcome train(const base::Data& data, std::int64_t micro, bb::nn::Precision precision,
              const bb::checkpointing::Policy& policy, std::int64_t steps) {
  bb::nn::ModelConfig config = base::model_config();
  config.precision = precision;
  bb::nn::Model model(config, bb::Device::cpu());
  if (policy.needs_runner()) {
    model.set_block_runner(bb::checkpointing::ScheduledRunner::for_policy(policy, config.depth));
  }
  bb::nn::Optimizer optimizer(model.parameters(), base::adamw_options());
  bb::train::TrainConfig run;
  run.batch = base::kWantedBatch;
  run.micro_batch = micro;
  run.steps = steps;
  run.seed = 5;
  run.loss_scaling = precision == bb::nn::Precision::fp16 ? bb::train::LossScaling::dynamic
                                                          : bb::train::LossScaling::none;
  bb::train::Trainer trainer(model, optimizer, data.train, run);
  trainer.run();
  Outcome outcome;
  outcome.largest_step_peak = trainer.largest_step_memory().peak_total;
  outcome.boundary_bytes = trainer.boundary_bytes();
  outcome.test = bb::nn::evaluate(model, data.test, micro);
  for (const auto& p : model.parameters()) outcome.parameters.push_back(p.value.to_vector<float>());
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  bb::DemoOptions options;
  if (auto exit = bb::parse_demo_options(argc, argv,
                                         "Chapter 06: plan the batch that did not fit, then "
                                         "train it under the same cap.",
                                         options)) {
    return *exit;
  }
  const bool quick = options.quick;
  const base::Data data = base::load_data(quick);
  bb::SelfCheck report("chapter 06");

  report.section("(a) The question: batch " + std::to_string(base::kWantedBatch) + " on a " +
                 bb::format_bytes(base::kDeviceBytes) + " device");
  const bb::nn::ModelConfig model = base::model_config();
  const planning::PlanRequest request{model, base::kWantedBatch, base::adamw_options(),
                                      base::kDeviceBytes};
  const bb::checkpointing::StepShape whole{model, base::kWantedBatch, base::kWantedBatch,
                                           base::adamw_options()};
  const std::size_t whole_peak = bb::checkpointing::predict_policy(whole, {}).peak();
  report.check(whole_peak > base::kDeviceBytes,
               "in one piece, fp32, no checkpointing, the step would peak at " +
                   bb::format_bytes(whole_peak) + ": it does not fit (chapter 01)");
  const planning::CostModel cost =
      planning::calibrate(model, base::adamw_options(), bb::Device::cpu(), base::kWantedBatch);
  report.note("cost model measured on this machine (" + cost.key + ")");
  const planning::PlanResult result = planning::make_plan(request, cost);
  std::printf("   %-34s %-10s %-20s %11s %10s\n", "micro-batch (per step)", "precision",
              "checkpoint", "peak", "step time");
  for (const planning::Plan& p : result.feasible) {
    std::printf("   %-34s %-10s %-20s %11s %8.3f s\n",
                (std::to_string(p.micro_batch) + " (" +
                 std::to_string((base::kWantedBatch + p.micro_batch - 1) / p.micro_batch) + ")")
                    .c_str(),
                bb::nn::precision_name(p.precision).c_str(), p.checkpoint.text().c_str(),
                bb::format_bytes(p.prediction.peak()).c_str(), p.seconds);
  }
  if (!report.check(!result.feasible.empty(), std::to_string(result.feasible.size()) +
                                                  " plans fit, of " +
                                                  std::to_string(result.weighed) + " weighed")) {
    return report.finish();
  }
  const planning::Plan& best = result.best();
  report.check(best.prediction.peak() <= base::kDeviceBytes,
               "the fastest, " + planning::describe(best, base::kWantedBatch) +
                   ", is predicted to peak at " + bb::format_bytes(best.prediction.peak()));

  const std::int64_t steps = quick ? 3 : 30;  // quick: 3 passes over 4096 samples; else 2 epochs
  report.section("(b) Train it under the cap, " + std::to_string(steps) +
                 " steps, and without a cap in one piece");
  Outcome planned;
  {
    bb::ScopedMemoryCap cap(bb::Device::cpu(), base::kDeviceBytes);
    planned = train(data, best.micro_batch, best.precision, best.checkpoint, steps);
  }
  const Outcome uncapped = train(data, base::kWantedBatch, bb::nn::Precision::fp32, {}, steps);
  // The memory model counts the model's step; the trainer's loss scaler also keeps its
  // pass's results (found-inf and the squared norm, 12 bytes) live for the whole run.
  const std::size_t scaler_bytes = planned.boundary_bytes;
  report.check(planned.largest_step_peak <= base::kDeviceBytes &&
                   planned.largest_step_peak == best.prediction.peak() + scaler_bytes,
               "every step of the plan fits the cap; the largest peak, " +
                   bb::format_bytes(planned.largest_step_peak) + ", is the predicted one" +
                   (scaler_bytes ? " plus the loss scaler's " + std::to_string(scaler_bytes) +
                                       " bytes"
                                 : ""));
  report.note("test accuracy: planned " + std::to_string(planned.test.accuracy) +
              ", uncapped in one piece " + std::to_string(uncapped.test.accuracy));
  if (best.precision == bb::nn::Precision::fp32) {
    // fp32 and LayerNorm: accumulation is bit for bit the batch (chapter 02), and
    // checkpointing recomputes the same bits (chapter 05).
    report.check(planned.parameters == uncapped.parameters &&
                     planned.test.correct == uncapped.test.correct,
                 "the plan is fp32: its parameters equal the uncapped run's, bit for bit");
  } else {
    // fp16 and bf16 round activations and gradients (chapters 03, 04): the same accuracy
    // to within a point, which chapter 04 measures over whole runs.
    report.check(std::abs(planned.test.accuracy - uncapped.test.accuracy) <= 0.01,
                 "the plan is " + bb::nn::precision_name(best.precision) +
                     ": its accuracy is within 1 point of the uncapped run's");
  }
  return report.finish();
}
