// Chapter 06: the planner. Chapter 01's batch of 4096 does not fit its 48 MiB device; the
// planner lists the plans that do, picks the fastest by a cost model measured here, and
// the batch trains with it under the same cap, to the uncapped run's result. Then the same
// question on a GPU the reader may not have, priced from its spec sheet (modelled, not
// measured). See README.md in this folder; --quick is the CTest setting.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/06_planner/planner.hpp"
#include "chapters/06_planner/roofline.hpp"
#include "chapters/train/trainer.hpp"
#include "common/format.hpp"
#include "common/integer_math.hpp"
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
              const bb::checkpointing::Policy& policy, std::int64_t steps,
              std::optional<std::size_t> cap = std::nullopt) {
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
  run.loss_scaling = bb::planning::plan_loss_scale(precision);
  Outcome outcome;
  {
    // The cap holds the training steps, which the plan predicts; the test's evaluation
    // after them is no part of the plan (its micro-batches of `micro` beside the trainer's
    // staging buffer, which lives as long as the trainer).
    std::optional<bb::ScopedMemoryCap> capped;
    if (cap) capped.emplace(bb::Device::cpu(), *cap);
    bb::train::Trainer trainer(model, optimizer, data.train, run);
    trainer.run();
    outcome.largest_step_peak = trainer.largest_step_memory().peak_total;
    outcome.boundary_bytes = trainer.boundary_bytes();
  }
  outcome.test = bb::nn::evaluate(model, data.test, micro);
  for (const auto& p : model.parameters()) outcome.parameters.push_back(p.value.to_vector<float>());
  return outcome;
}

/// `value` with `digits` decimals.
std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

/// A plan's row: micro-batch (per step), precision, checkpoint, peak, step time.
std::string plan_row(const planning::Plan& p) {
  const double ms = p.seconds * 1e3;
  char row[160];
  std::snprintf(row, sizeof row, "%-12s %-6s %-20s %10s %9.3f ms",
                (std::to_string(p.micro_batch) + " (" +
                 std::to_string(bb::ceil_div(base::kWantedBatch, p.micro_batch)) + ")")
                    .c_str(),
                bb::nn::precision_name(p.precision).c_str(), p.checkpoint.text().c_str(),
                bb::format_bytes(p.prediction.peak()).c_str(), ms);
  return row;
}

/// Section (c): the request of (a) priced for an H200 from its spec sheet, beside the
/// plans measured here. The peaks are the same exact predictions; only the times differ.
void on_a_modelled_gpu(bb::SelfCheck& report, const planning::PlanRequest& request,
                       const planning::PlanResult& here) {
  const planning::DeviceSpec spec = planning::h200_spec();
  report.section("(c) The same question on a GPU this machine is not: " + spec.name +
                 ", modelled, not measured");
  const planning::CostModel cost =
      *request.models.front()->modelled_cost(request.optimizer, spec, request.batch);
  const planning::PlanResult there = planning::make_plan(request, {cost});
  report.note("roofline: FP32 " + fixed(spec.fp32_flops / 1e12, 0) +
              " TFLOP/s, FP16/BF16 tensor cores " + fixed(spec.fp16_flops / 1e12, 0) +
              " TFLOP/s dense, " + fixed(spec.bytes_per_second / 1e12, 1) +
              " TB/s, a kernel launch assumed at " +
              fixed(spec.launch_seconds * 1e6, 0) + " us");
  std::printf("   %-54s   %s\n", "this CPU, measured", "H200, modelled");
  for (std::size_t i = 0; i < std::max(here.feasible.size(), there.feasible.size()); ++i) {
    std::printf("   %-54s   %s\n", i < here.feasible.size() ? plan_row(here.feasible[i]).c_str() : "",
                i < there.feasible.size() ? plan_row(there.feasible[i]).c_str() : "");
  }
  if (there.feasible.empty()) return;  // the same peaks as (a): it cannot be, (a) checked
  const planning::Plan& best = there.best();
  // Tensor cores run 16-bit GEMMs at 989 TFLOP/s against fp32's 67, and 16-bit activations
  // move half the bytes: on that device the model can only prefer a 16-bit plan.
  report.check(best.precision != bb::nn::Precision::fp32,
               "on the modelled H200 the fastest plan is 16-bit: " +
                   planning::describe(best, request.batch));
  report.note("there a micro-batch's fixed cost (" +
              fixed(cost.of(best.precision).micro_batch.fixed * 1e6, 0) +
              " us of launches and weight reads) outweighs its rows' (" +
              fixed(cost.of(best.precision).micro_batch.per_row * 1e9, 1) +
              " ns each), so it takes the fewest micro-batches that fit, recomputing to make "
              "them fit; here the rows cost most and the fixed part little");
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
  const auto mlp = std::make_shared<planning::MlpPlanned>(model);
  const planning::PlanRequest request{{mlp}, base::kWantedBatch, base::adamw_options(),
                                      base::kDeviceBytes};
  const bb::checkpointing::StepShape whole{std::make_shared<bb::nn::ModelLedger>(model),
                                           base::kWantedBatch, base::kWantedBatch,
                                           base::adamw_options()};
  const std::size_t whole_peak = bb::checkpointing::predict_policy(whole, {}).peak();
  report.check(whole_peak > base::kDeviceBytes,
               "in one piece, fp32, no checkpointing, the step would peak at " +
                   bb::format_bytes(whole_peak) + ": it does not fit (chapter 01)");
  const planning::CostModel cost =
      planning::calibrate(*mlp, base::adamw_options(), bb::Device::cpu(), base::kWantedBatch);
  report.note("cost model measured on this machine (" + cost.key + ")");
  const planning::PlanResult result = planning::make_plan(request, {cost});
  std::printf("   %-34s %-10s %-20s %11s %10s\n", "micro-batch (per step)", "precision",
              "checkpoint", "peak", "step time");
  for (const planning::Plan& p : result.feasible) {
    std::printf("   %-34s %-10s %-20s %11s %8.3f s\n",
                (std::to_string(p.micro_batch) + " (" +
                 std::to_string(bb::ceil_div(base::kWantedBatch, p.micro_batch)) + ")")
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
  const Outcome planned =
      train(data, best.micro_batch, best.precision, best.checkpoint, steps, base::kDeviceBytes);
  const Outcome uncapped = train(data, base::kWantedBatch, bb::nn::Precision::fp32, {}, steps);
  // The plan's peak counts the model's step and, under a loss scale, the boundary's pass
  // results (found-inf and the squared norm, 12 bytes) that the trainer keeps all run.
  report.check(planned.largest_step_peak <= base::kDeviceBytes &&
                   planned.largest_step_peak == best.prediction.peak(),
               "every step of the plan fits the cap; the largest peak, " +
                   bb::format_bytes(planned.largest_step_peak) + ", is the predicted one" +
                   (planned.boundary_bytes ? " (the loss scaler's " +
                                                 std::to_string(planned.boundary_bytes) +
                                                 " bytes included)"
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
  on_a_modelled_gpu(report, request, result);
  return report.finish();
}
