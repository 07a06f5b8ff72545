// roofline.cpp: a cost model from a spec sheet (roofline.hpp).
#include "chapters/06_planner/roofline.hpp"

#include <algorithm>
#include <variant>

namespace bigbatch::planning {

DeviceSpec h200_spec() {
  return {.name = "NVIDIA H200 SXM (spec sheet)",
          .fp32_flops = 67e12,
          .fp16_flops = 989e12,
          .bf16_flops = 989e12,
          .bytes_per_second = 4.8e12,
          .launch_seconds = 4e-6};
}

namespace {

/// The kernels of one pass, priced one by one at their roofline.
class Pass {
 public:
  Pass(const DeviceSpec& spec, double peak, double element_bytes)
      : spec_(spec), peak_(peak), s_(element_bytes) {}

  /// C [m, n] = A [m, k] B [k, n] in the pass's precision.
  void gemm(double m, double n, double k) {
    kernel(2 * m * n * k, s_ * (m * k + k * n + m * n));
  }
  /// The weight's gradient of a GEMM over `rows`: [in, out] accumulated in f32 (read and
  /// written) from the inputs and output gradients in the pass's precision.
  void weight_gradient(double rows, double in, double out) {
    kernel(2 * rows * in * out, s_ * rows * (in + out) + 8 * in * out);
  }
  /// A pass over `elements` that reads `reads` and writes `writes` tensors of that size,
  /// in the pass's precision (or `bytes` each, when given).
  void elementwise(double elements, double reads, double writes, double bytes = 0) {
    kernel(0, (bytes > 0 ? bytes : s_) * elements * (reads + writes));
  }
  double seconds() const { return seconds_; }

 private:
  void kernel(double flops, double bytes) {
    seconds_ += spec_.launch_seconds +
                std::max(flops / peak_, bytes / spec_.bytes_per_second);
  }
  const DeviceSpec& spec_;
  double peak_, s_;
  double seconds_ = 0;
};

double peak_of(const DeviceSpec& spec, nn::Precision precision) {
  switch (precision) {
    case nn::Precision::fp16: return spec.fp16_flops;
    case nn::Precision::bf16: return spec.bf16_flops;
    case nn::Precision::fp32: break;
  }
  return spec.fp32_flops;
}

}  // namespace

double roofline_micro_batch_seconds(const nn::ModelConfig& model, std::int64_t rows,
                                    const DeviceSpec& spec, bool forward_only) {
  const bool mixed = nn::is_mixed(model.precision);
  Pass pass(spec, peak_of(spec, model.precision), mixed ? 2.0 : 4.0);
  const auto r = static_cast<double>(rows);
  const auto d = static_cast<double>(model.inputs), h = static_cast<double>(model.hidden);
  const auto inner = h * static_cast<double>(model.expansion);
  const auto c = static_cast<double>(model.classes);
  const bool dropout = model.dropout > 0;

  // Forward: the stem, the blocks, the head and the loss.
  if (mixed) pass.elementwise(r * d, 0, 1, 3);  // the input read in f32, written in 16 bits
  pass.gemm(r, h, d);
  pass.elementwise(r * h, 1, 1);  // bias and activation
  for (std::int64_t i = 0; i < model.depth; ++i) {
    pass.elementwise(r * h, 1, 1);  // the norm
    pass.gemm(r, inner, h);
    pass.elementwise(r * inner, 1, 1);  // bias and activation
    if (dropout) pass.elementwise(r * inner, 1, 1);
    pass.gemm(r, h, inner);
    pass.elementwise(r * h, 2, 1);  // bias and the residual add
  }
  pass.elementwise(r * h, 1, 1);  // the head's norm
  pass.gemm(r, c, h);
  pass.elementwise(r * c, 1, 1, 4);  // the loss over f32 logits
  if (forward_only) return pass.seconds();

  // Backward: the loss's gradient, then each forward kernel's gradient, last first. A GEMM
  // gives its input's gradient (a GEMM) and its weight's (another) and its bias's (a
  // reduction); an elementwise pass reads its saved input beside the incoming gradient.
  pass.elementwise(r * c, 1, 1, 4);
  if (mixed) pass.elementwise(r * c, 1, 1, 3);  // dlogits to 16 bits
  const auto linear_backward = [&](double in, double out) {
    pass.gemm(r, in, out);
    pass.weight_gradient(r, in, out);
    pass.elementwise(r * out, 1, 0);  // the bias's gradient
  };
  linear_backward(h, c);
  pass.elementwise(r * h, 2, 1);  // the head's norm
  for (std::int64_t i = 0; i < model.depth; ++i) {
    linear_backward(inner, h);
    if (dropout) pass.elementwise(r * inner, 2, 1);
    pass.elementwise(r * inner, 2, 1);  // the activation
    linear_backward(h, inner);
    pass.elementwise(r * h, 3, 1);  // the norm, and the residual's gradient added
  }
  pass.elementwise(r * h, 2, 1);  // the stem's activation
  pass.weight_gradient(r, d, h);  // the stem's input needs no gradient
  pass.elementwise(r * h, 1, 0);
  return pass.seconds();
}

double roofline_optimizer_seconds(const nn::ModelConfig& model,
                                  const nn::Optimizer::Options& optimizer,
                                  const DeviceSpec& spec) {
  const auto d = static_cast<double>(model.inputs), h = static_cast<double>(model.hidden);
  const auto inner = h * static_cast<double>(model.expansion);
  const auto c = static_cast<double>(model.classes), depth = static_cast<double>(model.depth);
  const double parameters = d * h + h + depth * (2 * h * inner + inner + h + 2 * h) +
                            2 * h + h * c + c;
  const double tensors = 2 + depth * 6 + 2 + 2;  // stem, blocks, head norm, head
  // f32 value and gradient read, value written; each state tensor read and written; the
  // 16-bit working copy written.
  double bytes = 12;
  if (std::holds_alternative<AdamWOptions>(optimizer)) {
    bytes += 16;
  } else if (std::get<SgdOptions>(optimizer).momentum != 0) {
    bytes += 8;
  }
  if (nn::is_mixed(model.precision)) bytes += 2;
  return tensors * spec.launch_seconds + parameters * bytes / spec.bytes_per_second;
}

CostModel roofline_cost_model(const nn::ModelConfig& model,
                              const nn::Optimizer::Options& optimizer, const DeviceSpec& spec,
                              std::int64_t batch) {
  const std::pair<std::int64_t, std::int64_t> rows = calibration_rows(batch);
  const std::int64_t r1 = rows.first, r2 = rows.second;
  const auto costs = [&](nn::Precision precision) {
    nn::ModelConfig config = model;
    config.precision = precision;
    const auto at = [&](std::int64_t count, bool forward_only) {
      return roofline_micro_batch_seconds(config, count, spec, forward_only);
    };
    return PrecisionCost{fit_line(r1, at(r1, false), r2, at(r2, false)),
                         fit_line(r1, at(r1, true), r2, at(r2, true)),
                         roofline_optimizer_seconds(config, optimizer, spec),
                         LinearCost{}};  // the MLP rebuilds no attention probabilities
  };
  CostModel cost;
  cost.key = "modelled, not measured: " + MlpPlanned(model).shape_key(optimizer) + ", device " +
             spec.name;
  cost.fp32 = costs(nn::Precision::fp32);
  cost.fp16 = costs(nn::Precision::fp16);
  cost.bf16 = costs(nn::Precision::bf16);
  return cost;
}

}  // namespace bigbatch::planning
