// planner.hpp: chapter 06, "I have this much device memory and want this batch: what do I
// run?" A plan is a micro-batch size, a precision (fp16 always with dynamic loss scaling,
// bf16 with none) and a checkpoint policy. Its peak bytes come from chapter 05's exact memory model
// (predict_policy), its step time from a cost model fitted to a short measurement on the
// device; the planner lists every plan that fits and picks the fastest.
//
//   CostModel cost = calibrate(model, optimizer, Device::cpu());    // about 20 measurements
//   PlanResult result = make_plan({model, 4096, optimizer, 48 << 20}, cost);
//   result.best()   // e.g. micro-batch 512, fp32, checkpoint none
//
// The GPT (chapter 08) is planned the same way, a row being a sequence of T positions.
//
// The cost model, per precision p (one micro-batch of r rows; a step of B rows in
// n = ceil(B / m) micro-batches):
//   micro-batch forward + backward   a_p + b_p r        (fitted at two sizes)
//   forward alone                    c_p + d_p r        (what a recomputed block costs)
//   optimizer boundary               o_p
//   one block's P rebuilt            e_p + f_p r        (the GPT's selective attention)
//   step(m, p, policy) = o_p + n a_p + B b_p + (R / depth) (n c_p + B d_p)
//                        + A (n e_p + B f_p)
// where R is the policy's recomputation in block forwards per micro-batch
// (checkpointing::recompute_cost of its whole-block schedule) and A the blocks that rebuild
// their attention's probabilities in each micro-batch's backward: every block under
// `attention` and POLICY+attention, none otherwise. Rebuilding P costs heads T^2 work a
// sequence, which a block forward's c_p + d_p r does not scale with, so it is measured on
// its own (the kernel alone, at one and two sequences: P is heads T^2 elements a sequence).
// The fit is linear in r: fixed costs per micro-batch (launches, the head, the weights'
// reads) against costs per row. On a 2-core CPU the fixed part is small; on a GPU at small
// r it dominates, which is what makes tiny micro-batches slow there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
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

/// The measured costs of one precision (the table above).
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
  /// The predicted seconds of one optimizer step (the formula above); `recompute` is R,
  /// `rebuilt` is A.
  double step_seconds(std::int64_t batch, std::int64_t micro_batch, nn::Precision precision,
                      double recompute, std::int64_t depth, std::int64_t rebuilt = 0) const;
  /// The model as JSON (for the calibration file) and back; from_json throws
  /// std::runtime_error for a file that does not hold one (or one measured before bf16,
  /// which calibration_for measures again).
  Json to_json() const;
  static CostModel from_json(const Json& json);
};

/// What calibrate() is measured for, as a key: every field that changes the step's time.
std::string cost_key(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer,
                     Device device);
/// cost_key's part that names the model and the optimizer, not the device.
std::string shape_key(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer);

/// The same for chapter 08's GPT on sequences of `length` positions.
std::string cost_key(const nn::GptConfig& model, std::int64_t length,
                     const nn::Optimizer::Options& optimizer, Device device);
/// \copydoc shape_key(const nn::ModelConfig&, const nn::Optimizer::Options&)
std::string shape_key(const nn::GptConfig& model, std::int64_t length,
                      const nn::Optimizer::Options& optimizer);

/// The two row counts a cost model is fitted at for steps of up to `batch` rows:
/// min(batch, 16) (at most half the second) and min(batch, 128).
std::pair<std::int64_t, std::int64_t> calibration_rows(std::int64_t batch);

/// Measures the cost model on `device`: each precision's micro-batch step at two row
/// counts, its forward at the same two, and its optimizer step; each the median of
/// `repeats` runs after one warm-up run. Rows: min(batch, 16) and min(batch, 128).
CostModel calibrate(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer,
                    Device device, std::int64_t batch, int repeats = 3);

/// The same for chapter 08's GPT: a row is a sequence of `length` positions.
CostModel calibrate(const nn::GptConfig& model, std::int64_t length,
                    const nn::Optimizer::Options& optimizer, Device device, std::int64_t batch,
                    int repeats = 3);

/// The cost model for (model, optimizer, device) from the JSON file at `path` (an object
/// keyed by cost_key), measured and added to the file when it is not there or `fresh` is
/// set. `measured` (when given) tells whether it was measured now.
CostModel calibration_for(const std::string& path, const nn::ModelConfig& model,
                          const nn::Optimizer::Options& optimizer, Device device,
                          std::int64_t batch, bool fresh = false, bool* measured = nullptr);

/// The same for chapter 08's GPT (keyed by cost_key of the GPT).
CostModel calibration_for(const std::string& path, const nn::GptConfig& model,
                          std::int64_t length, const nn::Optimizer::Options& optimizer,
                          Device device, std::int64_t batch, bool fresh = false,
                          bool* measured = nullptr);

/// calibration_for's file (cost_file.cpp): the cost model under `key` in the JSON file at
/// `path`, or `calibrate()`'s, added to the file (written whole, then renamed over it), when
/// it is not there (or was measured before bf16) or `fresh` is set.
CostModel cached_cost_model(const std::string& path, const std::string& key, bool fresh,
                            bool* measured, const std::function<CostModel()>& calibrate);

/// The question: this model, this batch, this optimizer, this much device memory.
struct PlanRequest {
  nn::ModelConfig model;  ///< its precision is ignored: the planner chooses one
  std::int64_t batch = 0;
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

/// The question for chapter 08's GPT: the batch and its micro-batches in sequences of
/// `length` positions.
struct GptPlanRequest {
  nn::GptConfig model;        ///< its precision and attention are ignored: the planner chooses
  std::int64_t batch = 0;     ///< sequences per optimizer step
  std::int64_t length = 0;    ///< T, positions per sequence
  nn::Optimizer::Options optimizer;  ///< its state is live through the step
  std::size_t budget = 0;     ///< device bytes (as --device-memory caps them)
  /// The precisions to consider, as PlanRequest's.
  std::vector<nn::Precision> precisions = {nn::Precision::fp32, nn::Precision::fp16,
                                           nn::Precision::bf16};
  float clip_grad_norm = 0.0f;  ///< as PlanRequest's
  /// The attention kernels to consider (default both). Like a precision, each computes its
  /// own bits, and each has its own cost model (cost_key names the kernel).
  std::vector<nn::AttentionKernel> kernels = {nn::AttentionKernel::plain,
                                              nn::AttentionKernel::efficient};
};

/// The GPT's cost models, one for each attention kernel a request weighs.
using GptCostModels = std::map<nn::AttentionKernel, CostModel>;

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
/// down to 1, each once. With BatchNorm only the batch itself (smaller micro-batches
/// change the update: chapter 02).
std::vector<std::int64_t> micro_batch_candidates(const nn::ModelConfig& model, std::int64_t batch);

/// Answers `request`. For each precision it walks the micro-batches from the largest
/// down; at each, checkpoint policies in increasing recomputation (chapter 05's
/// candidates) until one fits (the cheapest that fits: every other fitting policy of this
/// micro-batch and precision is slower); once a micro-batch fits with no recomputation,
/// smaller ones can only be slower (more fixed costs) and are not weighed.
PlanResult make_plan(const PlanRequest& request, const CostModel& cost);
/// The same for the GPT, for each of request.kernels with its cost model in `costs`
/// (std::invalid_argument when one is missing), over the checkpoint policies that keep whole
/// blocks, and with plain attention those that rebuild its probabilities too.
PlanResult make_plan(const GptPlanRequest& request, const GptCostModels& costs);

/// "micro-batch 512 (8 per step), fp16 + dynamic loss scaling, checkpoint sqrt", and for
/// the GPT ", efficient attention" or ", plain attention"
std::string describe(const Plan& plan, std::int64_t batch);

}  // namespace bigbatch::planning
