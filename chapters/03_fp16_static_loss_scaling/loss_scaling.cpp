// loss_scaling.cpp: unscaling at the optimizer boundary, and the static scaler.
#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/check.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/fill.hpp"

namespace bigbatch::loss_scaling {

std::vector<Tensor> gradient_tensors(const nn::Network& model) {
  std::vector<Tensor> gradients;
  for (const nn::NamedParameter& p : model.parameters()) gradients.push_back(p.grad);
  return gradients;
}

bool unscale_gradients(const nn::Network& model, float scale, const Tensor& found_inf,
                       const Tensor* squared_norm) {
  return unscale_gradients(gradient_tensors(model), scale, found_inf, squared_norm);
}

GradientStats stats_from(bool overflow, double squared_norm) {
  GradientStats stats;
  stats.overflow = overflow;
  stats.squared_norm = squared_norm;
  stats.norm = static_cast<float>(std::sqrt(squared_norm));
  return stats;
}

// snippet: unscale
bool unscale_gradients(const std::vector<Tensor>& gradients, float scale,
                       const Tensor& found_inf, const Tensor* squared_norm) {
  BIGBATCH_CHECK(std::isfinite(scale) && scale > 0.0f,
                 "unscale_gradients: the scale must be finite and positive, got ", scale);
  fill(found_inf, 0.0);
  // 1/S is exact for a power of two; otherwise one rounding, as in PyTorch's GradScaler,
  // which also multiplies by the float reciprocal.
  if (squared_norm != nullptr) {
    unscale_and_check_finite(gradients, 1.0f / scale, found_inf, *squared_norm);
  } else {
    unscale_and_check_finite(gradients, 1.0f / scale, found_inf);
  }
  return found_inf.to_vector<float>()[0] != 0.0f;
}
// snippet end: unscale

void UnscalePass::allocate(Device device, bool with_norm) {
  if (!found_inf_.defined() || found_inf_.device() != device) {
    found_inf_ = Tensor({1}, DType::f32, device, MemoryCategory::workspace);
    squared_norm_ = Tensor();
  }
  if (with_norm && !squared_norm_.defined()) {
    squared_norm_ = Tensor({1}, DType::f64, device, MemoryCategory::workspace);
  }
}

bool UnscalePass::unscale(const nn::Network& model, float scale) {
  allocate(model.device(), /*with_norm=*/false);
  return unscale_gradients(model, scale, found_inf_);
}

GradientStats UnscalePass::unscale_and_measure(const nn::Network& model, float scale) {
  return unscale_and_measure(gradient_tensors(model), model.device(), scale);
}

GradientStats UnscalePass::unscale_and_measure(const std::vector<Tensor>& gradients,
                                               Device device, float scale) {
  allocate(device, /*with_norm=*/true);
  const bool overflow = unscale_gradients(gradients, scale, found_inf_, &squared_norm_);
  // The square root of the float64 sum, rounded once to float: within half an ulp of the
  // exact norm whenever the sum itself is (it is for any realistic parameter count).
  return stats_from(overflow, squared_norm_.to_vector<double>()[0]);
}

StaticLossScaler::StaticLossScaler(float scale) : scale_(scale) {
  BIGBATCH_CHECK(std::isfinite(scale) && scale > 0.0f,
                 "StaticLossScaler: the scale must be finite and positive, got ", scale);
}

bool StaticLossScaler::unscale_and_check(const nn::Network& model) {
  const bool overflow = pass_.unscale(model, scale_);
  if (overflow) ++skipped_;
  return !overflow;
}

RangeShares range_shares(const Tensor& x, DType dtype) {
  BIGBATCH_CHECK(is_half_width(dtype), "range_shares: the type must be f16 or bf16, got ",
                 dtype_name(dtype));
  const Tensor narrow(x.shape(), dtype), back(x.shape(), DType::f32);
  cast(x, narrow);
  cast(narrow, back);
  const std::vector<float> values = x.to_vector<float>(), rounded = back.to_vector<float>();
  const float smallest_normal = dtype == DType::f16 ? 0x1p-14f : 0x1p-126f;
  RangeShares shares;
  std::int64_t nonzero = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i] == 0.0f) continue;
    ++nonzero;
    if (rounded[i] == 0.0f) {
      shares.zero += 1;
    } else if (std::abs(rounded[i]) < smallest_normal) {
      shares.subnormal += 1;
    }
  }
  if (nonzero > 0) {
    shares.zero /= static_cast<double>(nonzero);
    shares.subnormal /= static_cast<double>(nonzero);
  }
  return shares;
}

double worst_normalised_error(const std::vector<std::vector<float>>& g,
                              const std::vector<std::vector<float>>& reference) {
  BIGBATCH_CHECK(g.size() == reference.size(), "worst_normalised_error: ", g.size(),
                 " tensors against ", reference.size());
  double worst = 0;
  for (std::size_t k = 0; k < g.size(); ++k) {
    BIGBATCH_CHECK(g[k].size() == reference[k].size(), "worst_normalised_error: tensor ", k,
                   " has ", g[k].size(), " values against ", reference[k].size());
    double diff = 0, norm = 0;
    for (std::size_t e = 0; e < g[k].size(); ++e) {
      diff += std::pow(double{g[k][e]} - reference[k][e], 2);
      norm += std::pow(double{reference[k][e]}, 2);
    }
    if (norm > 0) worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

}  // namespace bigbatch::loss_scaling
