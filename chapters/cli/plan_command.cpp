// plan_command.cpp: the planner's table, its JSON, and `bigbatch plan`.
#include "chapters/cli/plan_command.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <string>

#include "chapters/06_planner/roofline.hpp"
#include "chapters/07_data_parallel/rank_plan.hpp"
#include "chapters/cli/model_run.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/cli/train_command.hpp"
#include "common/format.hpp"
#include "common/integer_math.hpp"
#include "common/json.hpp"

namespace bigbatch::cli {
namespace {

/// The planner's cost-model file: --calibration, else $XDG_CACHE_HOME (or ~/.cache)
/// /bigbatch/calibration.json.
std::string calibration_path(const TrainOptions& options) {
  if (!options.plan.calibration.empty()) return options.plan.calibration;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache != nullptr && *cache != 0) {
    return std::string(cache) + "/bigbatch/calibration.json";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != 0 ? home : ".") +
         "/.cache/bigbatch/calibration.json";
}

/// One plan as JSON (bigbatch plan --json): its settings, predicted peak in bytes (and the
/// moment that holds it) and predicted seconds per step.
Json plan_json(const planning::Plan& plan, std::int64_t batch) {
  const loss_scaling::LossScaleRule scale = planning::plan_loss_scale(plan.precision);
  Json json = {{"micro_batch", plan.micro_batch},
               {"micro_batches", ceil_div(batch, plan.micro_batch)},
               {"precision", nn::precision_name(plan.precision)},
               {"loss_scale", loss_scaling::setting_text(scale)},
               {"checkpoint", plan.checkpoint.text()},
               {"recompute", plan.recompute},
               {"peak_bytes", plan.prediction.peak()},
               {"peak_moment", plan.prediction.peak_moment},
               {"seconds", plan.seconds}};
  if (plan.attention) json["attention"] = nn::attention_kernel_name(*plan.attention);
  return json;
}

/// " --attention efficient" for a GPT's plan, "" for the MLP's.
std::string attention_flag(const planning::Plan& plan) {
  return plan.attention ? " --attention " + nn::attention_kernel_name(*plan.attention) : "";
}

/// "1.234 ms".
std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f ms", seconds * 1e3);
  return text;
}

/// " --loss-scale dynamic", or nothing for no loss scale (the flag's default).
std::string loss_scale_flag(loss_scaling::LossScaleRule rule) {
  if (rule == loss_scaling::LossScaleRule::none) return "";
  return " --loss-scale " + loss_scaling::setting_text(rule);
}

/// Where a plan's step times come from, for the report.
struct CostSource {
  std::string where;         ///< the device planned for
  bool modelled = false;     ///< --device-model: a roofline, not measured
  std::string path;          ///< the calibration file ("" when modelled)
  bool measured = false;     ///< the calibration was measured now
  planning::CostModel cost;  ///< the cost model itself
};

/// The cost model of the MLP's or the GPT's step: from the calibration file, measured and
/// saved there when missing (UsageError for a file that is not one).
template <class Calibrate>
CostSource measured_costs(const TrainOptions& options, Device device, Calibrate&& calibrate) {
  CostSource source;
  source.where = device.name();
  source.path = calibration_path(options);
  try {
    source.cost = calibrate(source.path, &source.measured);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--calibration: ") + e.what());
  }
  return source;
}

/// The plans, reported: with --json one object (`extend` adds its fields), else the
/// header line (`header` adds lines after it) and the table, fastest first. `samples` is
/// what each plan's micro-batches split (the batch, or a rank's share of it). Throws
/// NoPlanFits, naming the smallest peak, when no plan fits.
planning::PlanResult report_plans(const TrainOptions& options, const planning::PlanResult& result,
                                  std::size_t budget, std::int64_t samples,
                                  const CostSource& source,
                                  const std::function<void(Json&)>& extend = {},
                                  const std::function<void()>& header = {}) {
  const std::int64_t batch = options.train.batch;
  if (options.plan.json) {
    Json answer = {{"batch", batch},
                   {"budget_bytes", budget},
                   {"device", source.where},
                   {"modelled", source.modelled},
                   {"calibration", source.path},
                   {"calibration_measured_now", source.measured},
                   {"cost_model", source.cost.to_json()},
                   {"weighed", result.weighed},
                   {"feasible", Json::array()}};
    if (extend) extend(answer);
    for (const planning::Plan& p : result.feasible) {
      answer["feasible"].push_back(plan_json(p, samples));
    }
    if (result.smallest) {  // nothing fits: the smallest peak, and what no plan can trade
      answer["smallest"] = plan_json(*result.smallest, samples);
      answer["fixed_bytes"] = result.fixed_bytes;
    }
    std::cout << answer.dump() << "\n" << std::flush;
  } else {
    std::cout << "plan: batch " << batch << " under " << format_bytes(budget) << " on "
              << source.where << "; step times "
              << (source.modelled
                      ? "modelled from its published figures (roofline), not measured"
                      : std::string("from the cost model ") +
                            (source.measured ? "measured now, saved to " : "in ") + source.path)
              << "\n";
    if (header) header();
  }
  if (result.feasible.empty()) {
    const planning::Plan& smallest = *result.smallest;
    throw NoPlanFits(
        "no plan fits the step in " + format_bytes(budget) + ": the smallest predicted "
        "peak is " + format_bytes(smallest.prediction.peak()) + " (" +
        planning::describe(smallest, samples) + "), of which " +
        format_bytes(result.fixed_bytes) + " are parameters, gradients, master weights, "
        "optimizer state and one micro-batch's samples, which no plan can trade away");
  }
  if (options.plan.json) return result;
  // The GPT's plans name their attention kernel in a column of their own.
  const bool kernels = result.feasible.front().attention.has_value();
  std::printf("  %-24s %-10s %-22s%s %12s %12s\n", "micro-batch (per step)", "precision",
              "checkpoint", kernels ? " attention " : "", "peak", "step time");
  for (std::size_t i = 0; i < result.feasible.size(); ++i) {
    const planning::Plan& p = result.feasible[i];
    const std::string micro = std::to_string(p.micro_batch) + " (" +
                              std::to_string(ceil_div(samples, p.micro_batch)) +
                              ")";
    const std::string kernel =
        p.attention ? " " + nn::attention_kernel_name(*p.attention) : std::string();
    // Milliseconds below a tenth of a second (a modelled GPU's steps), else seconds.
    const bool small = p.seconds < 0.1;
    std::printf("  %-24s %-10s %-22s%-*s %12s %10.4f %s%s\n", micro.c_str(),
                nn::precision_name(p.precision).c_str(), p.checkpoint.text().c_str(),
                kernels ? 11 : 0, kernel.c_str(), format_bytes(p.prediction.peak()).c_str(),
                small ? p.seconds * 1e3 : p.seconds, small ? "ms" : "s",
                i == 0 ? "  <- fastest" : "");
  }
  std::cout << "  (" << result.weighed << " plans weighed; fp16 trains with dynamic loss "
            << "scaling, bf16 with none)\n";
  return result;
}

/// The budget to plan for: --device-memory, which planning needs.
std::size_t plan_budget(const TrainOptions& options) {
  if (!options.device_memory) {
    throw UsageError("planning needs --device-memory SIZE, the memory to plan for");
  }
  return *options.device_memory;
}

}  // namespace

planning::PlanResult plan_for(const TrainOptions& options, const planning::PlannedModels& models,
                              Device device, std::optional<int> train_ranks) {
  const std::int64_t batch = options.train.batch;
  planning::PlanRequest request{models, batch, optimizer_options(options), plan_budget(options)};
  request.clip_grad_norm = options.train.clip_grad_norm;
  if (options.was_given("--precision")) request.precisions = {options.model.precision};
  const bool modelled = options.plan.modelled != ModelledDevice::none;
  if (modelled && (options.was_given("--calibration") || options.plan.recalibrate)) {
    throw UsageError("--device-model prices the plans from a spec sheet: it measures "
                     "nothing, so --calibration and --recalibrate do not apply");
  }
  // Each model's cost model: from the spec sheet, or measured here (and kept in the
  // calibration file). The report names the first; with attention kernels, the JSON all.
  CostSource source;
  std::vector<planning::CostModel> costs;
  Json cost_models = Json::object();
  for (const auto& model : models) {
    CostSource one;
    if (modelled) {
      const std::optional<planning::CostModel> cost =
          model->modelled_cost(request.optimizer, planning::h200_spec(), batch);
      if (!cost) {
        throw UsageError("--device-model prices a step from a spec sheet, which has no model "
                         "of this one's: it is planned on this machine's measurements");
      }
      one = {planning::h200_spec().name, true, "", false, *cost};
    } else {
      try {  // the calibration builds the model: a shape it refuses is the flags'
        one = measured_costs(options, device, [&](const std::string& path, bool* measured) {
          return planning::calibration_for(path, *model, request.optimizer, device, batch,
                                           options.plan.recalibrate, measured);
        });
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--model: ") + e.what());
      }
    }
    if (costs.empty()) source = one;
    source.measured = source.measured || one.measured;
    costs.push_back(one.cost);
    if (model->attention()) {
      cost_models[nn::attention_kernel_name(*model->attention())] = one.cost.to_json();
    }
  }
  // Chapter 07: rank 0's step of R on the modelled cluster, or the whole batch on one device.
  std::optional<data_parallel::RankPlans> rank_plans;
  int ranks = 1;
  if (train_ranks) {  // this machine's ranks, whose links the planner does not know
    ranks = *train_ranks;
    rank_plans = data_parallel::plan_share(request, costs.front(), ranks, options.parallel.zero);
  } else if (options.plan.ranks > 1 || options.was_given("--zero")) {
    if (!modelled) {
      throw UsageError("--ranks prices the gradient sum on a modelled cluster (chapter 07's "
                       "links): give --device-model h200");
    }
    if (options.plan.ranks > std::min<std::int64_t>(batch, std::numeric_limits<int>::max())) {
      throw UsageError("--ranks " + std::to_string(options.plan.ranks) + ": more ranks than "
                       "--batch " + std::to_string(batch) + " has samples, each rank needs one");
    }
    ranks = static_cast<int>(options.plan.ranks);  // at most the batch, an int's
    const data_parallel::Cluster cluster = data_parallel::h200_cluster();
    if (ranks > cluster.per_node && ranks % cluster.per_node != 0) {
      throw UsageError("--ranks " + std::to_string(ranks) + ": beyond one node of " +
                       std::to_string(cluster.per_node) + " GPUs the modelled cluster has "
                       "whole nodes only (a multiple of " + std::to_string(cluster.per_node) + ")");
    }
    rank_plans =
        data_parallel::plan_ranks(request, costs.front(), ranks, options.parallel.zero, cluster);
  }
  const planning::PlanResult result =
      rank_plans ? rank_plans->result : planning::make_plan(request, costs);
  // The samples each plan's micro-batches split: rank 0's share, or the batch.
  const std::int64_t samples = rank_plans ? rank_plans->share : batch;
  const auto extend = [&](Json& answer) {
    if (!cost_models.empty()) answer["cost_models"] = cost_models;
    if (!rank_plans) return;
    answer["ranks"] = ranks;
    answer["zero"] = data_parallel::setting_text(options.parallel.zero);
    answer["share"] = rank_plans->share;
    answer["sum_seconds_fp32"] = rank_plans->sum_seconds_fp32;
    answer["sum_seconds_16bit"] = rank_plans->sum_seconds_16bit;
    if (options.parallel.zero == data_parallel::ZeroStage::gradients) {
      answer["sum_seconds_per_further_micro_batch"] = rank_plans->seconds_per_further_micro_batch;
    }
  };
  const auto header = [&] {
    if (!rank_plans) return;
    std::cout << "rank 0 of " << ranks << " (ZeRO stage "
              << data_parallel::setting_text(options.parallel.zero) << "): its share of "
              << samples << " samples of each batch; ";
    if (train_ranks) {
      std::cout << "the gradient sum is not in the step times (this machine's links are "
                << "not modelled; "
                << (options.parallel.zero == data_parallel::ZeroStage::replicated
                        ? "the sum is the same for every plan)\n"
                    : options.parallel.zero == data_parallel::ZeroStage::optimizer_state
                        ? "at stage 1 the 16-bit plans gather their working copies, not "
                          "the f32 masters)\n"
                        : "at stage 2 each micro-batch adds a reduce-scatter, and the 16-bit "
                          "plans gather their working copies, not the f32 masters)\n");
    } else {
      std::cout << "every step time includes the gradient sum modelled on chapter 07's "
                << "cluster (assumed links, not measured): "
                << milliseconds(rank_plans->sum_seconds_fp32) << " in fp32, "
                << milliseconds(rank_plans->sum_seconds_16bit) << " in fp16 and bf16";
      if (options.parallel.zero == data_parallel::ZeroStage::gradients) {
        std::cout << " with one micro-batch per step, and "
                  << milliseconds(rank_plans->seconds_per_further_micro_batch)
                  << " more for each further micro-batch (stage 2's reduce-scatters)";
      }
      std::cout << "\n";
    }
  };
  return report_plans(options, result, request.budget, samples, source, extend, header);
}

int run_plan(TrainOptions options) {
  const std::unique_ptr<ModelRun> run = model_run(options);
  run->check_flags(options);
  check_outputs(options);
  const Splits splits = load_data(options);
  const Device device = available_device(options);
  check_parameters_fit(options, run->parameter_bytes(options, splits, /*planned=*/true), device,
                       /*against_cap=*/false);
  const planning::Plan best = plan_for(options, run->planned(options, splits), device).best();
  if (options.plan.json) return 0;
  if (options.plan.ranks > 1) {
    std::cout << "train it with: mpirun -np " << options.plan.ranks << " bigbatch train ... "
              << "--data-parallel --zero " << data_parallel::setting_text(options.parallel.zero)
              << " --micro-batch " << best.micro_batch << " --precision "
              << nn::precision_name(best.precision)
              << loss_scale_flag(planning::plan_loss_scale(best.precision))
              << " --checkpoint " << best.checkpoint.text() << "\n";
    return 0;
  }
  std::cout << "train it with: --micro-batch " << best.micro_batch << " --precision "
            << nn::precision_name(best.precision)
            << loss_scale_flag(planning::plan_loss_scale(best.precision))
            << " --checkpoint " << best.checkpoint.text() << attention_flag(best)
            << " (or --plan auto)\n";
  return 0;
}

}  // namespace bigbatch::cli
