// planner.hpp: chapter 06, "I have this much device memory and want this batch: what do I
// run?" A plan is a micro-batch size, a precision (fp16 always with dynamic loss scaling,
// bf16 with none) and a checkpoint policy. Its peak bytes come from chapter 05's exact
// memory model (predict_policy), its step time from a cost model fitted to a short
// measurement on the device (CostModel); the planner lists every plan that fits and picks
// the fastest. A model brings itself as a PlannedModel: the MLP, the GPT.
//
//   auto model = std::make_shared<MlpPlanned>(config);
//   CostModel cost = calibrate(*model, optimizer, Device::cpu(), 4096);  // ~20 measurements
//   PlanResult result = make_plan({{model}, 4096, optimizer, 48 << 20}, {cost});
//   result.best()   // e.g. micro-batch 512, fp32, checkpoint none
//
// Why and how (the cost model's terms): docs/internals.md#chapters06_plannerplannerhpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chapters/04_dynamic_loss_scaling/optimizer_boundary.hpp"
#include "chapters/05_activation_checkpointing/policy.hpp"
#include "common/device.hpp"
#include "common/json_fwd.hpp"
#include "nn/gpt.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::planning {

/// Seconds = fixed * count + per_row * rows: a cost linear in the rows, with a fixed part
/// per call.
struct LinearCost {
  double fixed = 0;    ///< seconds per call
  double per_row = 0;  ///< seconds per row
};

/// The line through (r1, t1) and (r2, t2), as calibrate() fits its two measurements:
/// per_row is never negative (noise on a nearly flat cost) and fixed, the intercept, never
/// below 0 (per_row is then kept and fixed is 0); one point (r2 <= r1) gives the constant t1.
LinearCost fit_line(std::int64_t r1, double t1, std::int64_t r2, double t2);

/// The measured costs of one precision p, for one micro-batch of r rows: a_p + b_p r its
/// forward and backward, c_p + d_p r its forward alone (what a recomputed block costs), o_p
/// the optimizer's step, e_p + f_p r one block's attention probabilities rebuilt.
struct PrecisionCost {
  LinearCost micro_batch;  ///< a_p, b_p: forward + backward of one micro-batch
  LinearCost forward;      ///< c_p, d_p: the forward pass alone
  double optimizer = 0;    ///< o_p: the optimizer's step over every parameter
  /// e_p, f_p: one block's attention probabilities rebuilt from q and k (the GPT with plain
  /// attention; zero for a model that has none to rebuild).
  LinearCost probabilities;
};

/// A cost model: what it was measured for (key) and the costs of fp32, fp16 and bf16.
struct CostModel {
  std::string key;  ///< the model's shape, the optimizer, the device and its threads
  PrecisionCost fp32, fp16, bf16;

  /// The costs of `precision`.
  const PrecisionCost& of(nn::Precision precision) const;
  /// The predicted seconds of one optimizer step of B rows in n = ceil(B / m) micro-batches:
  /// o_p + n a_p + B b_p + (R / depth) (n c_p + B d_p) + A (n e_p + B f_p), where R is the
  /// policy's recomputation in block forwards per micro-batch and A the blocks that rebuild
  /// their attention's probabilities in each micro-batch's backward; `recompute` is R,
  /// `rebuilt` is A.
  double step_seconds(std::int64_t batch, std::int64_t micro_batch, nn::Precision precision,
                      double recompute, std::int64_t depth, std::int64_t rebuilt = 0) const;
  /// The model as JSON (for the calibration file) and back; from_json throws
  /// std::runtime_error for a file that does not hold one (or one measured before bf16,
  /// which calibration_for measures again).
  Json to_json() const;
  static CostModel from_json(const Json& json);
};

struct DeviceSpec;  // roofline.hpp

/// A model as the planner weighs it: what its step's time depends on, its step's bytes in
/// each precision, the micro-batches and checkpoint policies it can run, and the
/// measurement of its costs. A model brings one (MlpPlanned, GptPlanned); make_plan, the
/// cost file and the ranks (chapter 07) take any.
class PlannedModel {
 public:
  virtual ~PlannedModel() = default;
  /// What changes the step's time besides the device, as text (cost_key adds the device).
  virtual std::string shape_key(const nn::Optimizer::Options& optimizer) const = 0;
  /// The model in `precision` as chapter 05's memory model replays its step.
  virtual std::shared_ptr<nn::NetworkLedger> ledger(nn::Precision precision) const = 0;
  /// The micro-batch sizes weighed for a batch of `batch` (micro_batch_candidates).
  virtual std::vector<std::int64_t> micro_batches(std::int64_t batch) const = 0;
  /// One precision's costs measured on `device` (calibrate's measurements, PrecisionCost),
  /// at rows min(batch, 16) and min(batch, 128).
  virtual PrecisionCost measure(nn::Precision precision, const nn::Optimizer::Options& optimizer,
                                Device device, std::int64_t batch, int repeats) const = 0;
  /// The cost model on a device described by its spec sheet (roofline.hpp), where the model
  /// has one; none by default (its plans are priced by measurement only).
  virtual std::optional<CostModel> modelled_cost(const nn::Optimizer::Options& optimizer,
                                                 const DeviceSpec& spec,
                                                 std::int64_t batch) const;
  /// The attention kernel its plans run (the GPT's), or none.
  virtual std::optional<nn::AttentionKernel> attention() const { return std::nullopt; }

  /// Its blocks, the chain a checkpoint schedule runs.
  std::int64_t depth() const { return ledger(nn::Precision::fp32)->depth(); }
  /// The policies weighed, in this order: chapter 05's candidates whose keep its blocks can
  /// keep (nn::NetworkLedger::keeps), each that keeps whole blocks followed by the same
  /// schedule rebuilding the attention's probabilities where the blocks can.
  std::vector<checkpointing::Policy> policies() const;
};

/// The residual MLP of chapters 00-07.
class MlpPlanned final : public PlannedModel {
 public:
  /// The MLP of `model` (its precision is the plan's to choose).
  explicit MlpPlanned(const nn::ModelConfig& model) : model_(model) {}
  /// "inputs D, classes C, hidden H, ..., optimizer adamw".
  std::string shape_key(const nn::Optimizer::Options& optimizer) const override;
  std::shared_ptr<nn::NetworkLedger> ledger(nn::Precision precision) const override;
  /// Every size, or with BatchNorm the batch alone (smaller ones change the update).
  std::vector<std::int64_t> micro_batches(std::int64_t batch) const override;
  PrecisionCost measure(nn::Precision precision, const nn::Optimizer::Options& optimizer,
                        Device device, std::int64_t batch, int repeats) const override;
  /// roofline_cost_model's.
  std::optional<CostModel> modelled_cost(const nn::Optimizer::Options& optimizer,
                                         const DeviceSpec& spec,
                                         std::int64_t batch) const override;

 private:
  nn::ModelConfig model_;
};

/// Chapter 08's GPT on sequences of `length` positions (a row is a sequence), with one
/// attention kernel: each kernel computes its own bits and has its own cost model.
class GptPlanned final : public PlannedModel {
 public:
  /// The GPT of `model` (its precision is the plan's to choose; its attention is the
  /// plans').
  GptPlanned(const nn::GptConfig& model, std::int64_t length) : model_(model), length_(length) {}
  /// "gpt, vocabulary V, context T, length L, ..., attention plain, ...".
  std::string shape_key(const nn::Optimizer::Options& optimizer) const override;
  std::shared_ptr<nn::NetworkLedger> ledger(nn::Precision precision) const override;
  /// Every size (LayerNorm).
  std::vector<std::int64_t> micro_batches(std::int64_t batch) const override;
  /// With plain attention also one block's P rebuilt, at one and two sequences.
  PrecisionCost measure(nn::Precision precision, const nn::Optimizer::Options& optimizer,
                        Device device, std::int64_t batch, int repeats) const override;
  std::optional<nn::AttentionKernel> attention() const override { return model_.attention; }

 private:
  nn::GptConfig model_;
  std::int64_t length_ = 0;
};

/// The models a request weighs.
using PlannedModels = std::vector<std::shared_ptr<const PlannedModel>>;

/// What calibrate() is measured for, as a key: every field that changes the step's time
/// (the model's shape_key) and the device with its threads.
std::string cost_key(const PlannedModel& model, const nn::Optimizer::Options& optimizer,
                     Device device);

/// The two row counts a cost model is fitted at for steps of up to `batch` rows:
/// min(batch, 16) (at most half the second) and min(batch, 128).
std::pair<std::int64_t, std::int64_t> calibration_rows(std::int64_t batch);

/// Measures the cost model on `device`: each precision's micro-batch step at two row
/// counts, its forward at the same two, and its optimizer step; each the median of
/// `repeats` runs after one warm-up run. Rows: min(batch, 16) and min(batch, 128).
CostModel calibrate(const PlannedModel& model, const nn::Optimizer::Options& optimizer,
                    Device device, std::int64_t batch, int repeats = 3);

/// The cost model for (model, optimizer, device) from the JSON file at `path` (an object
/// keyed by cost_key), measured and added to the file when it is not there or `fresh` is
/// set. `measured` (when given) tells whether it was measured now.
CostModel calibration_for(const std::string& path, const PlannedModel& model,
                          const nn::Optimizer::Options& optimizer, Device device,
                          std::int64_t batch, bool fresh = false, bool* measured = nullptr);

/// calibration_for's file (cost_file.cpp): the cost model under `key` in the JSON file at
/// `path`, or `calibrate()`'s, added to the file (written whole, then renamed over it), when
/// it is not there (or was measured before bf16) or `fresh` is set.
CostModel cached_cost_model(const std::string& path, const std::string& key, bool fresh,
                            bool* measured, const std::function<CostModel()>& calibrate);

/// The question: this model, this batch, this optimizer, this much device memory.
struct PlanRequest {
  /// The models weighed, each with its own cost model (make_plan's `costs`): one, or the
  /// GPT with each attention kernel. Their precision is ignored: the planner chooses one.
  PlannedModels models;
  std::int64_t batch = 0;  ///< rows per optimizer step (the GPT's: sequences)
  nn::Optimizer::Options optimizer;
  std::size_t budget = 0;  ///< device bytes (as --device-memory caps them)
  /// The precisions to consider (default all three); fp16 means dynamic loss scaling,
  /// bf16 no loss scale (it has fp32's range).
  std::vector<nn::Precision> precisions = {nn::Precision::fp32, nn::Precision::fp16,
                                           nn::Precision::bf16};
  /// The global L2 norm the run clips its gradients to (0: off). With clipping, or with
  /// fp16's loss scale, the optimizer boundary keeps its pass's 12 bytes through every
  /// step, and each plan's peak counts them.
  float clip_grad_norm = 0.0f;
  /// What each plan's step holds a part of: one rank's shards when chapter 07 plans a
  /// rank's step under ZeRO (the default, all of it).
  nn::HeldElements held = {};
};

/// The loss scale a plan of this precision trains with: dynamic for fp16 (whose range
/// needs one, chapter 04), none for fp32 and bf16.
loss_scaling::LossScaleRule plan_loss_scale(nn::Precision precision);

/// One answer.
struct Plan {
  std::int64_t micro_batch = 0;
  nn::Precision precision = nn::Precision::fp32;
  checkpointing::Policy checkpoint;  ///< a chapter 05 policy (never a budget)
  nn::StepPrediction prediction;    ///< its step, byte by byte
  double recompute = 0;             ///< R, block forwards per micro-batch
  double seconds = 0;               ///< predicted seconds per optimizer step
  /// The GPT's attention kernel; none for the MLP.
  std::optional<nn::AttentionKernel> attention = std::nullopt;
};

/// The planner's order: the faster plan first, the smaller peak on a tie.
bool faster(const Plan& a, const Plan& b);

/// Every feasible plan, fastest first, and what was weighed.
struct PlanResult {
  std::vector<Plan> feasible;  ///< sorted by seconds, then by peak
  /// When nothing fits: the smallest peak any weighed plan reaches, that plan, and the
  /// bytes at that peak that no plan can trade away (parameters, their gradients, fp32
  /// master weights, optimizer state and that plan's micro-batch of samples on the device).
  std::optional<Plan> smallest;
  std::size_t fixed_bytes = 0;
  std::size_t weighed = 0;  ///< (micro-batch, precision, policy[, kernel]) plans predicted
  /// The fastest plan; throws std::logic_error when none is feasible.
  const Plan& best() const;
};

/// The micro-batch sizes the planner weighs: batch, ceil(batch / 2), ceil(batch / 4), ...
/// down to 1, each once. (With BatchNorm the MLP weighs only the batch itself: smaller
/// micro-batches change the update, chapter 02.)
std::vector<std::int64_t> micro_batch_candidates(std::int64_t batch);

/// Answers `request`, weighing each of its models with the cost model of the same index in
/// `costs` (std::invalid_argument when the counts differ). For each precision it walks the
/// micro-batches from the largest down; at each, the model's checkpoint policies in
/// increasing recomputation until one fits (the cheapest that fits: every other fitting
/// policy of this micro-batch and precision is slower); once a micro-batch fits with no
/// recomputation, smaller ones can only be slower (more fixed costs) and are not weighed.
PlanResult make_plan(const PlanRequest& request, const std::vector<CostModel>& costs);

/// "micro-batch 512 (8 per step), fp16 + dynamic loss scaling, checkpoint sqrt", and for
/// the GPT ", efficient attention" or ", plain attention"
std::string describe(const Plan& plan, std::int64_t batch);

}  // namespace bigbatch::planning
