// planner.cpp: the cost model's calibration and the search over plans.
#include "chapters/06_planner/planner.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <stdexcept>
#include <variant>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/06_planner/roofline.hpp"
#include "common/cuda_runtime.hpp"
#include "common/format.hpp"
#include "common/integer_math.hpp"
#include "common/rng.hpp"
#include "kernels/attention.hpp"
#include "kernels/cpu_parallel.hpp"

namespace bigbatch::planning {
namespace {

/// The median of `repeats` timings of `run` after one untimed warm-up run; waits for the
/// device after each run, so a CUDA run is timed to its end.
template <class Run>
double median_seconds(Device device, int repeats, Run run) {
  const auto finish = [&] {
    if (device.is_cuda()) cuda_rt::synchronize();
  };
  run();
  finish();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    finish();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

std::pair<std::int64_t, std::int64_t> calibration_rows(std::int64_t batch) {
  const std::int64_t r2 = std::max<std::int64_t>(1, std::min<std::int64_t>(batch, 128));
  return {std::max<std::int64_t>(1, std::min<std::int64_t>(r2 / 2, 16)), r2};
}

LinearCost fit_line(std::int64_t r1, double t1, std::int64_t r2, double t2) {
  LinearCost cost;
  if (r2 > r1) cost.per_row = std::max(0.0, (t2 - t1) / static_cast<double>(r2 - r1));
  cost.fixed = std::max(0.0, t1 - cost.per_row * static_cast<double>(r1));
  return cost;
}

namespace {

/// The costs of one precision on a built model: its micro-batch step (forward, loss,
/// backward) at rows r1 and r2 of `x` and `y`, its forward at the same two, and its
/// optimizer's step.
PrecisionCost measure_costs(nn::Network& model, nn::Optimizer& optimizer, const Tensor& x,
                            const Tensor& y, Device device, std::int64_t batch, int repeats) {
  const auto [r1, r2] = calibration_rows(batch);
  const auto micro_step = [&](std::int64_t rows) {
    return median_seconds(device, repeats, [&] {
      model.zero_grad();
      nn::accumulate_gradients(model, x.rows(0, rows), y.rows(0, rows), rows, {true, 1, 0});
    });
  };
  const auto forward = [&](std::int64_t rows) {
    return median_seconds(device, repeats, [&] { model.forward(x.rows(0, rows), {true, 1, 0}); });
  };
  PrecisionCost cost;
  cost.micro_batch = fit_line(r1, micro_step(r1), r2, micro_step(r2));
  cost.forward = fit_line(r1, forward(r1), r2, forward(r2));
  cost.optimizer = median_seconds(device, repeats, [&] { optimizer.step(); });
  return cost;
}

}  // namespace

PrecisionCost MlpPlanned::measure(nn::Precision precision,
                                  const nn::Optimizer::Options& options, Device device,
                                  std::int64_t batch, int repeats) const {
  nn::ModelConfig config = model_;
  config.precision = precision;
  const std::int64_t r2 = calibration_rows(batch).second;
  nn::Model model(config, device);
  nn::Optimizer optimizer(model.parameters(), options);
  std::vector<float> features(static_cast<std::size_t>(r2 * config.inputs));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(r2));
  for (std::size_t i = 0; i < features.size(); ++i) {
    features[i] = random_uniform(config.seed, /*stream=*/17, i) * 2 - 1;
  }
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(config.classes));
  }
  const Tensor x = Tensor::from_vector(features, {r2, config.inputs}).to(device);
  const Tensor y = Tensor::from_vector(labels, {r2}).to(device);
  return measure_costs(model, optimizer, x, y, device, batch, repeats);
}

// The GPT's: rows are sequences of `length` random tokens, each position's target the next
// token (no padding: a sequence's cost does not depend on its token values).
PrecisionCost GptPlanned::measure(nn::Precision precision,
                                  const nn::Optimizer::Options& options, Device device,
                                  std::int64_t batch, int repeats) const {
  nn::GptConfig config = model_;
  config.precision = precision;
  const std::int64_t length = length_;
  const std::int64_t r2 = calibration_rows(batch).second;
  nn::Gpt model(config, device);
  nn::Optimizer optimizer(model.parameters(), options);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(r2 * (length + 1)));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(random_uniform(config.seed, /*stream=*/17, i) *
                                          static_cast<float>(config.vocabulary)) %
                static_cast<std::int32_t>(config.vocabulary);
  }
  std::vector<std::int32_t> inputs, targets;
  for (std::int64_t r = 0; r < r2; ++r) {
    const auto first = tokens.begin() + r * (length + 1);
    inputs.insert(inputs.end(), first, first + length);
    targets.insert(targets.end(), first + 1, first + length + 1);
  }
  const Tensor x = Tensor::from_vector(inputs, {r2, length}).to(device);
  const Tensor y = Tensor::from_vector(targets, {r2, length}).to(device);
  PrecisionCost cost = measure_costs(model, optimizer, x, y, device, batch, repeats);
  if (config.attention == nn::AttentionKernel::plain) {
    // One block's P rebuilt from q and k, for one and two sequences (zeros: the kernel's
    // work does not depend on the values).
    const auto rebuild = [&](std::int64_t sequences) {
      const DType dtype = nn::working_dtype(config.precision);
      const Tensor qkv = Tensor::zeros({sequences, length, 3 * config.width}, dtype, device);
      const Tensor p({sequences, config.heads, length, length}, dtype, device,
                     MemoryCategory::activations);
      return median_seconds(device, repeats,
                            [&] { causal_attention_probabilities(qkv, p, config.heads); });
    };
    cost.probabilities = fit_line(1, rebuild(1), 2, rebuild(2));
  }
  return cost;
}

const PrecisionCost& CostModel::of(nn::Precision precision) const {
  switch (precision) {
    case nn::Precision::fp32: return fp32;
    case nn::Precision::fp16: return fp16;
    case nn::Precision::bf16: return bf16;
  }
  return fp32;
}

// snippet: cost
double CostModel::step_seconds(std::int64_t batch, std::int64_t micro_batch,
                               nn::Precision precision, double recompute, std::int64_t depth,
                               std::int64_t rebuilt) const {
  const PrecisionCost& c = of(precision);
  const double n = static_cast<double>(ceil_div(batch, micro_batch));
  const double rows = static_cast<double>(batch);
  const double per_block = depth > 0 ? recompute / static_cast<double>(depth) : 0.0;
  return c.optimizer + n * c.micro_batch.fixed + rows * c.micro_batch.per_row +
         per_block * (n * c.forward.fixed + rows * c.forward.per_row) +
         static_cast<double>(rebuilt) *
             (n * c.probabilities.fixed + rows * c.probabilities.per_row);
}
// snippet end: cost


namespace {

/// The optimizer as its step's cost sees it: AdamW, or SGD with or without the momentum
/// buffer (which its step reads and writes).
std::string optimizer_word(const nn::Optimizer::Options& optimizer) {
  if (std::holds_alternative<AdamWOptions>(optimizer)) return "adamw";
  return std::get<SgdOptions>(optimizer).momentum != 0 ? "sgd with momentum" : "sgd";
}

}  // namespace

std::string MlpPlanned::shape_key(const nn::Optimizer::Options& optimizer) const {
  std::ostringstream key;
  key << "inputs " << model_.inputs << ", classes " << model_.classes << ", hidden "
      << model_.hidden << ", expansion " << model_.expansion << ", depth " << model_.depth
      << ", norm " << nn::norm_name(model_.norm) << ", activation "
      << (model_.activation == nn::Activation::gelu ? "gelu" : "relu") << ", dropout "
      << model_.dropout << ", optimizer " << optimizer_word(optimizer);
  return key.str();
}

std::string GptPlanned::shape_key(const nn::Optimizer::Options& optimizer) const {
  std::ostringstream key;
  key << "gpt, vocabulary " << model_.vocabulary << ", context " << model_.context
      << ", length " << length_ << ", layers " << model_.layers << ", width " << model_.width
      << ", heads " << model_.heads << ", attention " << nn::attention_kernel_name(model_.attention)
      << ", dropout " << model_.dropout << ", optimizer " << optimizer_word(optimizer);
  return key.str();
}

std::string cost_key(const PlannedModel& model, const nn::Optimizer::Options& optimizer,
                     Device device) {
  // Where it was measured: the device, and the CPU's threads.
  return model.shape_key(optimizer) + ", device " +
         (device.is_cuda() ? cuda_rt::device_name() : std::string("cpu")) + ", threads " +
         std::to_string(device.is_cuda() ? 0 : cpu::max_threads());
}

CostModel calibrate(const PlannedModel& model, const nn::Optimizer::Options& optimizer,
                    Device device, std::int64_t batch, int repeats) {
  CostModel cost;
  cost.key = cost_key(model, optimizer, device);
  cost.fp32 = model.measure(nn::Precision::fp32, optimizer, device, batch, repeats);
  cost.fp16 = model.measure(nn::Precision::fp16, optimizer, device, batch, repeats);
  cost.bf16 = model.measure(nn::Precision::bf16, optimizer, device, batch, repeats);
  return cost;
}

CostModel calibration_for(const std::string& path, const PlannedModel& model,
                          const nn::Optimizer::Options& optimizer, Device device,
                          std::int64_t batch, bool fresh, bool* measured) {
  return cached_cost_model(path, cost_key(model, optimizer, device), fresh, measured,
                           [&] { return calibrate(model, optimizer, device, batch); });
}

std::optional<CostModel> PlannedModel::modelled_cost(const nn::Optimizer::Options&,
                                                     const DeviceSpec&, std::int64_t) const {
  return std::nullopt;
}

std::optional<CostModel> MlpPlanned::modelled_cost(const nn::Optimizer::Options& optimizer,
                                                   const DeviceSpec& spec,
                                                   std::int64_t batch) const {
  return roofline_cost_model(model_, optimizer, spec, batch);
}

std::vector<checkpointing::Policy> PlannedModel::policies() const {
  const std::shared_ptr<nn::NetworkLedger> model = ledger(nn::Precision::fp32);
  std::vector<checkpointing::Policy> policies;
  for (checkpointing::Policy policy : checkpointing::checkpoint_candidates(model->depth())) {
    if (!model->keeps(policy.keep)) continue;  // the MLP block's selective, for the GPT
    policies.push_back(policy);
    if (policy.keep == nn::BlockKeep::all && model->keeps(nn::BlockKeep::all_but_probabilities)) {
      policy.keep = nn::BlockKeep::all_but_probabilities;
      policies.push_back(policy);
    }
  }
  return policies;
}

std::shared_ptr<nn::NetworkLedger> MlpPlanned::ledger(nn::Precision precision) const {
  nn::ModelConfig config = model_;
  config.precision = precision;
  return std::make_shared<nn::ModelLedger>(config);
}

std::shared_ptr<nn::NetworkLedger> GptPlanned::ledger(nn::Precision precision) const {
  nn::GptConfig config = model_;
  config.precision = precision;
  return std::make_shared<nn::GptLedger>(config, length_);
}

std::vector<std::int64_t> MlpPlanned::micro_batches(std::int64_t batch) const {
  if (model_.norm == nn::Norm::batch) return {batch};
  return micro_batch_candidates(batch);
}

std::vector<std::int64_t> GptPlanned::micro_batches(std::int64_t batch) const {
  return micro_batch_candidates(batch);
}

const Plan& PlanResult::best() const {
  if (feasible.empty()) throw std::logic_error("PlanResult::best: no plan fits");
  return feasible.front();
}

std::vector<std::int64_t> micro_batch_candidates(std::int64_t batch) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t parts = 1;; parts *= 2) {
    const std::int64_t m = ceil_div(batch, parts);
    if (sizes.empty() || sizes.back() != m) sizes.push_back(m);
    if (m == 1) break;
  }
  return sizes;
}

loss_scaling::LossScaleRule plan_loss_scale(nn::Precision precision) {
  return precision == nn::Precision::fp16 ? loss_scaling::LossScaleRule::dynamic
                                          : loss_scaling::LossScaleRule::none;
}

bool faster(const Plan& a, const Plan& b) {
  return a.seconds != b.seconds ? a.seconds < b.seconds : a.prediction.peak() < b.prediction.peak();
}

namespace {

/// R and A of the cost model for `policy` on `depth` blocks: the block forwards its
/// whole-block schedule recomputes, and the blocks that rebuild their probabilities.
std::pair<double, std::int64_t> recomputation_of(checkpointing::Policy policy,
                                                 std::int64_t depth) {
  std::int64_t rebuilt = 0;
  if (policy.keep == nn::BlockKeep::all_but_probabilities) {
    rebuilt = depth;
    policy.keep = nn::BlockKeep::all;
  }
  return {checkpointing::recompute_cost(policy, depth), rebuilt};
}

/// The plans of one model, added to `result`: for each precision and micro-batch the
/// fastest policy that fits.
// snippet: search
void add_plans(const PlanRequest& request, const PlannedModel& model, const CostModel& cost,
               PlanResult& result) {
  const std::int64_t depth = model.depth();
  const std::vector<checkpointing::Policy> policies = model.policies();
  for (const nn::Precision precision : request.precisions) {
    for (const std::int64_t micro : model.micro_batches(request.batch)) {
      const loss_scaling::BoundaryOptions boundary{.rule = plan_loss_scale(precision),
                                                   .clip_grad_norm = request.clip_grad_norm};
      const checkpointing::StepShape step{model.ledger(precision), request.batch, micro,
                                          request.optimizer,
                                          loss_scaling::boundary_workspace_bytes(boundary),
                                          request.held};
      // The fastest policy that fits, the smaller peak on a tie (chapter 05's order on
      // ties of both).
      std::optional<Plan> chosen;
      for (const checkpointing::Policy& policy : policies) {
        const auto [recompute, rebuilt] = recomputation_of(policy, depth);
        const double seconds =
            cost.step_seconds(request.batch, micro, precision, recompute, depth, rebuilt);
        if (chosen && seconds > chosen->seconds) continue;  // slower than one that fits
        Plan plan{micro, precision, policy, checkpointing::predict_policy(step, policy),
                  recompute, seconds, model.attention()};
        ++result.weighed;
        if (!result.smallest || plan.prediction.peak() < result.smallest->prediction.peak()) {
          result.smallest = plan;
        }
        if (plan.prediction.peak() > request.budget) continue;
        if (!chosen || faster(plan, *chosen)) chosen = plan;
      }
      if (!chosen) continue;
      result.feasible.push_back(*chosen);
      // Without recomputation, smaller micro-batches only add fixed costs.
      if (chosen->checkpoint == checkpointing::Policy{}) break;
    }
  }
}
// snippet end: search

}  // namespace

PlanResult make_plan(const PlanRequest& request, const std::vector<CostModel>& costs) {
  BIGBATCH_CHECK(costs.size() == request.models.size(), "make_plan: ", costs.size(),
                 " cost models for ", request.models.size(), " models");
  PlanResult result;
  for (std::size_t i = 0; i < costs.size(); ++i) {
    add_plans(request, *request.models[i], costs[i], result);
  }
  std::stable_sort(result.feasible.begin(), result.feasible.end(), faster);
  if (!result.feasible.empty()) {
    result.smallest.reset();
  } else if (result.smallest) {
    const MemoryStats& s = result.smallest->prediction.stats;
    for (const MemoryCategory c : {MemoryCategory::parameters, MemoryCategory::gradients,
                                   MemoryCategory::master_weights, MemoryCategory::optimizer_state,
                                   MemoryCategory::data}) {
      result.fixed_bytes += s.at_peak_of(c);
    }
  }
  return result;
}

std::string describe(const Plan& plan, std::int64_t batch) {
  const std::int64_t n = ceil_div(batch, plan.micro_batch);
  return "micro-batch " + std::to_string(plan.micro_batch) + " (" + std::to_string(n) +
         " per step), " +
         nn::precision_name(plan.precision) +
         (plan_loss_scale(plan.precision) == loss_scaling::LossScaleRule::dynamic
              ? " + dynamic loss scaling"
              : "") +
         ", checkpoint " + plan.checkpoint.text() +
         (plan.attention ? ", " + nn::attention_kernel_name(*plan.attention) + " attention" : "");
}

}  // namespace bigbatch::planning
