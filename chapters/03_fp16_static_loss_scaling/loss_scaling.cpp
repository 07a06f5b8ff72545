// loss_scaling.cpp: unscaling at the optimizer boundary, and the static scaler.
#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"

#include <cmath>
#include <vector>

#include "common/check.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/fill.hpp"

namespace bigbatch::loss_scaling {

bool unscale_gradients(const nn::Model& model, float scale, const Tensor& found_inf,
                       const Tensor* squared_norm) {
  BIGBATCH_CHECK(std::isfinite(scale) && scale > 0.0f,
                 "unscale_gradients: the scale must be finite and positive, got ", scale);
  std::vector<Tensor> gradients;
  for (const nn::NamedParameter& p : model.parameters()) gradients.push_back(p.grad);
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

StaticLossScaler::StaticLossScaler(float scale) : scale_(scale) {
  BIGBATCH_CHECK(std::isfinite(scale) && scale > 0.0f,
                 "StaticLossScaler: the scale must be finite and positive, got ", scale);
}

bool StaticLossScaler::unscale_and_check(const nn::Model& model) {
  if (!found_inf_.defined()) {
    found_inf_ = Tensor({1}, DType::f32, model.device(), MemoryCategory::workspace);
  }
  const bool overflow = unscale_gradients(model, scale_, found_inf_);
  if (overflow) ++skipped_;
  return !overflow;
}

}  // namespace bigbatch::loss_scaling
