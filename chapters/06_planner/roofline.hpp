// roofline.hpp: chapter 06's cost model for a device the reader does not have, built from
// its spec sheet instead of measured on it. Modelled, not measured: every figure it gives
// says so.
//
// Every kernel of a micro-batch of r rows (the model's GEMMs, its norms, activations, the
// loss) is priced at its roofline, the larger of its arithmetic at the precision's peak
// and its bytes at the memory bandwidth, plus one kernel launch:
//   t(kernel) = launch + max(flops / peak_p, bytes / bandwidth)
//   GEMM [m, k] x [k, n]:  flops 2 m n k, bytes s (m k + k n + m n)  (s: 4 fp32, 2 fp16/bf16)
//   elementwise pass:      bytes s x elements read and written, no arithmetic to speak of
// The backward pass runs two GEMMs per forward GEMM (the input's gradient, in 16 bits, and
// the weight's, accumulated in f32) and reads its saved activations beside the incoming
// gradient. The optimizer reads and writes each parameter's f32 value, its gradient and
// its state. The sums at r = 16 and r = 128 are fitted to a line, as calibrate() fits its
// two measurements, so that CostModel::step_seconds prices a plan either way.
//
// What the spec sheet does not say is assumed and named: a kernel launch costs
// DeviceSpec::launch_seconds, and the GEMMs reach the sheet's peak. Both flatter the
// device at small sizes; the point of the model is the shape of the trade (where the fixed
// cost of a micro-batch, recomputation and 16-bit arithmetic win or lose), not its
// seconds. When a GPU is lent, its measured calibration replaces the model, and the two
// compared is a result.
#pragma once

#include <cstdint>
#include <string>

#include "chapters/06_planner/planner.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::planning {

/// A device's published figures (dense, without structured sparsity) and the one assumed.
struct DeviceSpec {
  std::string name;                ///< what the figures are, e.g. the sheet they come from
  double fp32_flops = 0;           ///< FP32 without tensor cores (CUBLAS_COMPUTE_32F's GEMMs)
  double fp16_flops = 0;           ///< FP16 tensor cores, f32 accumulation
  double bf16_flops = 0;           ///< BF16 tensor cores, f32 accumulation
  double bytes_per_second = 0;     ///< memory bandwidth
  double launch_seconds = 0;       ///< per kernel: assumed, not on the sheet
};

/// NVIDIA's published H200 SXM figures: FP32 67 TFLOP/s, FP16 and BF16 tensor cores
/// 989 TFLOP/s dense (1979 with sparsity), 4.8 TB/s of HBM3e; a launch assumed at 4 us.
DeviceSpec h200_spec();

/// The seconds the roofline gives one micro-batch's forward and backward of `rows` rows
/// (`forward_only`: the forward alone, what a recomputed pass costs), in the model's
/// precision, on `spec`.
double roofline_micro_batch_seconds(const nn::ModelConfig& model, std::int64_t rows,
                                    const DeviceSpec& spec, bool forward_only);

/// The optimizer's step over every parameter on `spec`: its bytes at the bandwidth, one
/// launch per parameter tensor.
double roofline_optimizer_seconds(const nn::ModelConfig& model,
                                  const nn::Optimizer::Options& optimizer,
                                  const DeviceSpec& spec);

/// The cost model of `model` and `optimizer` on `spec`, for steps of up to `batch` rows:
/// each precision's micro-batch and forward costs at rows min(batch, 16) and
/// min(batch, 128) fitted as calibrate() fits its measurements. Its key starts with
/// "modelled, not measured:" and names the device.
CostModel roofline_cost_model(const nn::ModelConfig& model,
                              const nn::Optimizer::Options& optimizer, const DeviceSpec& spec,
                              std::int64_t batch);

}  // namespace bigbatch::planning
