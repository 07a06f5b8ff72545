// planner.cpp: the cost model's calibration and the search over plans.
#include "chapters/06_planner/planner.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <stdexcept>
#include <variant>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
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

PrecisionCost measure_precision(const nn::ModelConfig& config,
                                const nn::Optimizer::Options& options, Device device,
                                std::int64_t batch, int repeats) {
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

/// The GPT's: rows are sequences of `length` random tokens, each position's target the next
/// token (no padding: a sequence's cost does not depend on its token values).
PrecisionCost measure_precision(const nn::GptConfig& config, std::int64_t length,
                                const nn::Optimizer::Options& options, Device device,
                                std::int64_t batch, int repeats) {
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

}  // namespace

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

std::string shape_key(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer) {
  std::ostringstream key;
  key << "inputs " << model.inputs << ", classes " << model.classes << ", hidden "
      << model.hidden << ", expansion " << model.expansion << ", depth " << model.depth
      << ", norm " << nn::norm_name(model.norm) << ", activation "
      << (model.activation == nn::Activation::gelu ? "gelu" : "relu") << ", dropout "
      << model.dropout << ", optimizer " << optimizer_word(optimizer);
  return key.str();
}

namespace {

/// ", device NAME, threads N": the part of a cost key that names where it was measured.
std::string device_key(Device device) {
  return ", device " + (device.is_cuda() ? cuda_rt::device_name() : std::string("cpu")) +
         ", threads " + std::to_string(device.is_cuda() ? 0 : cpu::max_threads());
}

}  // namespace

std::string cost_key(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer,
                     Device device) {
  return shape_key(model, optimizer) + device_key(device);
}

std::string shape_key(const nn::GptConfig& model, std::int64_t length,
                      const nn::Optimizer::Options& optimizer) {
  std::ostringstream key;
  key << "gpt, vocabulary " << model.vocabulary << ", context " << model.context
      << ", length " << length << ", layers " << model.layers << ", width " << model.width
      << ", heads " << model.heads << ", attention " << nn::attention_kernel_name(model.attention)
      << ", dropout " << model.dropout << ", optimizer " << optimizer_word(optimizer);
  return key.str();
}

std::string cost_key(const nn::GptConfig& model, std::int64_t length,
                     const nn::Optimizer::Options& optimizer, Device device) {
  return shape_key(model, length, optimizer) + device_key(device);
}

namespace {

/// Every precision's costs, measured by `measure(config of that precision)`.
template <class Config, class Measure>
CostModel calibrate_each(std::string key, const Config& model, Measure&& measure) {
  CostModel cost;
  cost.key = std::move(key);
  Config config = model;
  config.precision = nn::Precision::fp32;
  cost.fp32 = measure(config);
  config.precision = nn::Precision::fp16;
  cost.fp16 = measure(config);
  config.precision = nn::Precision::bf16;
  cost.bf16 = measure(config);
  return cost;
}

}  // namespace

CostModel calibrate(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer,
                    Device device, std::int64_t batch, int repeats) {
  return calibrate_each(cost_key(model, optimizer, device), model,
                        [&](const nn::ModelConfig& config) {
                          return measure_precision(config, optimizer, device, batch, repeats);
                        });
}

CostModel calibrate(const nn::GptConfig& model, std::int64_t length,
                    const nn::Optimizer::Options& optimizer, Device device, std::int64_t batch,
                    int repeats) {
  return calibrate_each(cost_key(model, length, optimizer, device), model,
                        [&](const nn::GptConfig& config) {
                          return measure_precision(config, length, optimizer, device, batch,
                                                   repeats);
                        });
}

CostModel calibration_for(const std::string& path, const nn::ModelConfig& model,
                          const nn::Optimizer::Options& optimizer, Device device,
                          std::int64_t batch, bool fresh, bool* measured) {
  return cached_cost_model(path, cost_key(model, optimizer, device), fresh, measured,
                           [&] { return calibrate(model, optimizer, device, batch); });
}

CostModel calibration_for(const std::string& path, const nn::GptConfig& model,
                          std::int64_t length, const nn::Optimizer::Options& optimizer,
                          Device device, std::int64_t batch, bool fresh, bool* measured) {
  return cached_cost_model(path, cost_key(model, length, optimizer, device), fresh, measured,
                           [&] { return calibrate(model, length, optimizer, device, batch); });
}

const Plan& PlanResult::best() const {
  if (feasible.empty()) throw std::logic_error("PlanResult::best: no plan fits");
  return feasible.front();
}

std::vector<std::int64_t> micro_batch_candidates(const nn::ModelConfig& model,
                                                 std::int64_t batch) {
  if (model.norm == nn::Norm::batch) return {batch};
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

std::int64_t depth_of(const nn::ModelConfig& model) { return model.depth; }
std::int64_t depth_of(const nn::GptConfig& model) { return model.layers; }

/// The policies a request weighs: chapter 05's candidates for the MLP; for the GPT those
/// that keep whole blocks, and with plain attention each of them again with the attention's
/// probabilities rebuilt (`attention`, POLICY+attention).
std::vector<checkpointing::Policy> policies_of(const nn::ModelConfig& model) {
  return checkpointing::checkpoint_candidates(model.depth);
}
std::vector<checkpointing::Policy> policies_of(const nn::GptConfig& model) {
  std::vector<checkpointing::Policy> policies;
  for (checkpointing::Policy policy : checkpointing::checkpoint_candidates(model.layers)) {
    if (policy.keep != nn::BlockKeep::all) continue;  // the MLP block's selective
    policies.push_back(policy);
    if (model.attention == nn::AttentionKernel::plain) {
      policy.keep = nn::BlockKeep::all_but_probabilities;
      policies.push_back(policy);
    }
  }
  return policies;
}

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

std::vector<std::int64_t> micro_batches_of(const nn::ModelConfig& model, std::int64_t batch) {
  return micro_batch_candidates(model, batch);
}
std::vector<std::int64_t> micro_batches_of(const nn::GptConfig&, std::int64_t batch) {
  return micro_batch_candidates(nn::ModelConfig{}, batch);  // LayerNorm: every size
}

/// The step a plan of micro-batch `micro` runs, as chapter 05's memory model takes it.
checkpointing::StepShape step_of(const PlanRequest& request, const nn::ModelConfig& config,
                                 std::int64_t micro, std::size_t boundary_bytes) {
  return {std::make_shared<nn::ModelLedger>(config), request.batch, micro, request.optimizer,
          boundary_bytes, request.held};
}
checkpointing::StepShape step_of(const GptPlanRequest& request, const nn::GptConfig& config,
                                 std::int64_t micro, std::size_t boundary_bytes) {
  return {std::make_shared<nn::GptLedger>(config, request.length), request.batch, micro,
          request.optimizer, boundary_bytes};
}

/// A model to plan (the GPT's with one attention kernel) and its cost model.
template <class Config>
struct Variant {
  Config model;
  const CostModel* cost;
  std::optional<nn::AttentionKernel> attention;  // the GPT's kernel, for the plans
};

/// The plans of one variant, added to `result`: for each precision and micro-batch the
/// fastest policy that fits.
template <class Request, class Config>
// snippet: search
void add_plans(const Request& request, const Variant<Config>& variant, PlanResult& result) {
  const CostModel& cost = *variant.cost;
  const std::int64_t depth = depth_of(variant.model);
  const std::vector<checkpointing::Policy> policies = policies_of(variant.model);
  for (const nn::Precision precision : request.precisions) {
    auto config = variant.model;
    config.precision = precision;
    for (const std::int64_t micro : micro_batches_of(config, request.batch)) {
      const loss_scaling::BoundaryOptions boundary{.rule = plan_loss_scale(precision),
                                                   .clip_grad_norm = request.clip_grad_norm};
      const auto step =
          step_of(request, config, micro, loss_scaling::boundary_workspace_bytes(boundary));
      // The fastest policy that fits, the smaller peak on a tie (chapter 05's order on
      // ties of both).
      std::optional<Plan> chosen;
      for (const checkpointing::Policy& policy : policies) {
        const auto [recompute, rebuilt] = recomputation_of(policy, depth);
        const double seconds =
            cost.step_seconds(request.batch, micro, precision, recompute, depth, rebuilt);
        if (chosen && seconds > chosen->seconds) continue;  // slower than one that fits
        Plan plan{micro, precision, policy, checkpointing::predict_policy(step, policy),
                  recompute, seconds, variant.attention};
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

template <class Request, class Config>
PlanResult search(const Request& request, const std::vector<Variant<Config>>& variants) {
  PlanResult result;
  for (const Variant<Config>& variant : variants) add_plans(request, variant, result);
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

}  // namespace

PlanResult make_plan(const PlanRequest& request, const CostModel& cost) {
  return search(request, std::vector<Variant<nn::ModelConfig>>{{request.model, &cost, {}}});
}

PlanResult make_plan(const GptPlanRequest& request, const GptCostModels& costs) {
  std::vector<Variant<nn::GptConfig>> variants;
  for (const nn::AttentionKernel kernel : request.kernels) {
    const auto cost = costs.find(kernel);
    BIGBATCH_CHECK(cost != costs.end(), "make_plan: no cost model for ",
                   nn::attention_kernel_name(kernel), " attention");
    nn::GptConfig model = request.model;
    model.attention = kernel;
    variants.push_back({model, &cost->second, kernel});
  }
  return search(request, variants);
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
