// Chapter 05: activation checkpointing. Chapter 01's model made deep (32 blocks): its
// activations grow with depth; keeping only some block inputs and recomputing the rest in
// the backward pass trades compute for that memory. Every policy is a schedule of actions
// run by one driver, and every one of them must give the gradients of the run without
// checkpointing, bit for bit. See README.md in this folder; --quick is the CTest setting.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "common/format.hpp"
#include "common/memory.hpp"
#include "common/report.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bb = bigbatch;
namespace cp = bb::checkpointing;
using bb::MemoryCategory;

namespace {

std::string number(double value, const char* format = "%.3g") {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

bb::nn::ModelConfig deep(std::int64_t depth) {
  bb::nn::ModelConfig config = bb::baseline::model_config();
  config.depth = depth;
  config.dropout = 0.1f;  // recomputed blocks must draw the same masks
  return config;
}

struct Measured {
  std::size_t activation_bytes = 0;  // activations + checkpoints at the step's peak
  std::size_t step_bytes = 0;        // what the step adds at its peak to what was live
  std::int64_t block_forwards = 0;
  double seconds = 0;                // the fastest of the repetitions
  std::vector<std::vector<float>> gradients;
};

/// One forward and backward of the batch, `repeats` times, under a policy.
Measured measure(std::int64_t depth, const cp::Policy& policy, const bb::Tensor& x,
                 const bb::Tensor& labels, int repeats) {
  bb::nn::Model model(deep(depth), bb::Device::cpu());
  std::shared_ptr<cp::ScheduledRunner> runner;
  if (policy.needs_runner()) {
    runner = cp::ScheduledRunner::for_policy(policy, depth);
    model.set_block_runner(runner);
  }
  bb::TrackingAllocator& allocator = bb::allocator_for(bb::Device::cpu());
  Measured m;
  m.seconds = 1e30;
  for (int r = 0; r < repeats; ++r) {
    model.zero_grad();
    allocator.reset_peak();
    const auto start = std::chrono::steady_clock::now();
    bb::nn::accumulate_gradients(model, x, labels, x.dim(0), {true, 5, 0});
    m.seconds = std::min(
        m.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    const bb::MemoryStats stats = allocator.stats();
    m.activation_bytes = stats.at_peak_of(MemoryCategory::activations) +
                         stats.at_peak_of(MemoryCategory::checkpoints);
    m.step_bytes = stats.peak_total - stats.live_total;  // the step leaves nothing behind
  }
  m.block_forwards = runner ? runner->evaluations() / repeats : depth;
  for (const auto& p : model.parameters()) m.gradients.push_back(p.grad.to_vector<float>());
  return m;
}

void the_problem(bb::SelfCheck& report, const bb::Tensor& x, const bb::Tensor& labels) {
  report.section("(a) The problem: activation memory grows with depth");
  std::vector<std::size_t> bytes;
  std::string line = "activations at the step's peak, batch " + std::to_string(x.dim(0)) + ":";
  for (const std::int64_t depth : {4, 8, 16}) {
    bytes.push_back(measure(depth, cp::Policy{}, x, labels, 1).activation_bytes);
    line += "  depth " + std::to_string(depth) + " " + bb::format_bytes(bytes.back());
  }
  report.note(line);
  // Every block keeps the same tensors, so the bytes are a + b depth exactly.
  report.check(bytes[2] - bytes[1] == 2 * (bytes[1] - bytes[0]) && bytes[1] > bytes[0],
               "each block adds the same bytes: memory linear in depth (" +
                   bb::format_bytes((bytes[1] - bytes[0]) / 4) + " per block)");
}

void the_schedules(bb::SelfCheck& report) {
  report.section("(b) The schedules: sqrt(n) segments and the binomial optimum");
  bool agree = true;
  for (std::int64_t n = 1; n <= 64; ++n) {
    for (std::int64_t s = 1; s <= 8; ++s) {
      agree &= cp::binomial_advances(n, s) == cp::brute_force_advances(n, s);
    }
  }
  report.check(agree, "the closed form r n - C(s + r, s + 1) equals the dynamic program for "
                      "every chain of 1 to 64 blocks and 1 to 8 slots");
  const cp::Schedule example = cp::optimal(10, 3);
  report.note("the worked example, 10 blocks and 3 slots (" +
              std::to_string(cp::advances(example)) + " recomputed block forwards):");
  std::printf("%s\n", cp::explain(example).c_str());
  std::string table = "depth 32, recomputed block forwards:";
  for (const std::string policy : {"every:2", "every:4", "sqrt", "every:8", "optimal:2",
                                   "optimal:3", "optimal:6"}) {
    table += "  " + policy + " " +
             std::to_string(cp::advances(cp::Policy::parse(policy).schedule_for(32)));
  }
  report.note(table);
  bool optimal = true;
  for (const std::int64_t slots : {1, 2, 3, 6, 12}) {
    optimal &= cp::advances(cp::optimal(32, slots)) == cp::binomial_advances(32, slots);
  }
  report.check(optimal, "the binomial schedules for 32 blocks (1, 2, 3, 6 and 12 slots) "
                        "recompute exactly the closed form's minimum");
}

cp::StepShape step_of(std::int64_t depth, const bb::Tensor& x) {
  return {std::make_shared<bb::nn::ModelLedger>(deep(depth)), x.dim(0), x.dim(0),
          bb::AdamWOptions{}};
}

/// The bytes the step adds at its peak to what was live before it, predicted.
std::size_t step_bytes(const bb::nn::StepPrediction& p) {
  return p.stats.peak_total - p.stats.live_total;
}

void deep_model(bb::SelfCheck& report, const bb::Tensor& x, const bb::Tensor& labels,
                bool quick, bb::Json& figure_data) {
  const std::int64_t depth = 32;
  report.section("(c) Depth 32, batch " + std::to_string(x.dim(0)) +
                 ": every policy against no checkpointing, measured and predicted");
  const int repeats = quick ? 1 : 3;
  const Measured none = measure(depth, cp::Policy{}, x, labels, repeats);
  std::printf("   %-14s %12s %7s %12s %12s %9s %6s\n", "policy", "activations", "x less",
              "step peak", "predicted", "forwards", "time");
  bool identical = true, predicted_exactly = true;
  std::size_t sqrt_bytes = 0, optimal_bytes = 0;
  std::size_t selective_bytes = 0;
  for (const std::string text : {"none", "every:4", "sqrt", "every:8", "optimal:2",
                                 "optimal:6", "selective", "sqrt+selective"}) {
    const cp::Policy policy = cp::Policy::parse(text);
    const Measured m = policy == cp::Policy{} ? none : measure(depth, policy, x, labels, repeats);
    const bb::nn::StepPrediction predicted = cp::predict_policy(step_of(depth, x), policy);
    identical &= m.gradients == none.gradients;
    predicted_exactly &= step_bytes(predicted) == m.step_bytes &&
                         predicted.stats.at_peak_of(MemoryCategory::activations) +
                                 predicted.stats.at_peak_of(MemoryCategory::checkpoints) ==
                             m.activation_bytes &&
                         predicted.block_forwards == m.block_forwards;
    if (text == "sqrt") sqrt_bytes = m.activation_bytes;
    if (text == "optimal:2") optimal_bytes = m.activation_bytes;
    if (text == "selective") selective_bytes = m.activation_bytes;
    figure_data.push_back({{"policy", text},
                           {"activation_bytes", m.activation_bytes},
                           {"step_bytes", m.step_bytes},
                           {"predicted_step_bytes", step_bytes(predicted)},
                           {"block_forwards", m.block_forwards},
                           {"time_ratio", m.seconds / none.seconds}});
    std::printf("   %-14s %12s %7s %12s %12s %9lld %5sx\n", text.c_str(),
                bb::format_bytes(m.activation_bytes).c_str(),
                number(static_cast<double>(none.activation_bytes) /
                       static_cast<double>(m.activation_bytes), "%.2f").c_str(),
                bb::format_bytes(m.step_bytes).c_str(),
                bb::format_bytes(step_bytes(predicted)).c_str(),
                static_cast<long long>(m.block_forwards),
                number(m.seconds / none.seconds, "%.2f").c_str());
  }
  report.note("activations: activations + checkpoints at the step's peak; step peak: all "
              "the step adds to what was live (workspace too); time: the fastest of " +
              std::to_string(repeats) + " steps, relative to none (bench/ measures it "
              "properly)");
  report.check(identical, "every policy gives the gradients of no checkpointing, bit for bit "
                          "(dropout 0.1: recomputed blocks draw the same masks)");
  report.check(predicted_exactly, "the memory model predicted every step peak, its "
                                  "activations and the block forwards before the step ran, "
                                  "to the byte");
  report.check(sqrt_bytes * 4 <= none.activation_bytes,
               "sqrt keeps at most a quarter of the activation bytes");
  report.check(optimal_bytes < sqrt_bytes, "the binomial schedule with 2 slots keeps less");
  report.check(selective_bytes * 10 <= none.activation_bytes * 7,
               "selective recomputation keeps at most 70% of the bytes, recomputing no block");
}

void budget(bb::SelfCheck& report, const bb::Tensor& x, const bb::Tensor& labels) {
  const std::int64_t depth = 32;
  report.section("(d) budget:BYTES: the cheapest policy that fits, chosen before running");
  const cp::StepShape step = step_of(depth, x);
  const bb::nn::StepPrediction none = cp::predict_policy(step, cp::Policy{});
  report.note("without checkpointing the step peaks at " + bb::format_bytes(none.peak()) +
              " (" + bb::format_bytes(step_bytes(none)) + " of it the step's own), at: " +
              none.peak_moment);
  bool fits = true;
  for (const int percent : {90, 60, 40}) {
    // A budget that leaves `percent` of the step's own bytes on top of what is always live.
    const std::size_t budget =
        none.stats.live_total + step_bytes(none) * static_cast<std::size_t>(percent) / 100;
    const cp::BudgetChoice choice = cp::choose_for_budget(step, budget);
    const Measured m = measure(depth, choice.policy, x, labels, 1);
    fits &= m.step_bytes <= budget - none.stats.live_total;
    std::printf("   budget %s (the step's own %d%%): %s, %s predicted, %s measured, "
                "%lld block forwards; its peak at: %s\n",
                bb::format_bytes(budget).c_str(), percent, choice.policy.text().c_str(),
                bb::format_bytes(step_bytes(choice.prediction)).c_str(),
                bb::format_bytes(m.step_bytes).c_str(),
                static_cast<long long>(m.block_forwards), choice.prediction.peak_moment.c_str());
  }
  report.check(fits, "each chosen policy's measured step fits its budget");
}

}  // namespace

int main(int argc, char** argv) {
  bb::DemoOptions options;
  if (const auto status = bb::parse_demo_options(
          argc, argv,
          "  Shows and checks activation checkpointing (see\n"
          "  chapters/05_activation_checkpointing/README.md).\n"
          "  --write-data FILE  the table of (c) as JSON",
          options)) {
    return *status;
  }
  std::printf("Chapter 05: activation checkpointing\n");
  const bb::baseline::Data data = bb::baseline::load_data(options.quick);
  const std::int64_t batch = options.quick ? 32 : 128;
  const bb::Tensor x = data.train.features.rows(0, batch).to(bb::Device::cpu());
  const bb::Tensor labels = data.train.labels.rows(0, batch).to(bb::Device::cpu());
  bb::SelfCheck report("chapter 05");
  the_problem(report, x, labels);
  the_schedules(report);
  bb::Json figure_data = bb::Json::array();
  deep_model(report, x, labels, options.quick, figure_data);
  budget(report, x, labels);
  if (!bb::write_demo_data(options,
                           {{"depth", 32}, {"batch", batch}, {"policies", figure_data}})) {
    return 1;
  }
  return report.finish();
}
