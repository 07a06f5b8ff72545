// bf16_costs.cpp: the measurements and predictions of bf16_costs.hpp.
#include "chapters/04_dynamic_loss_scaling/bf16_costs.hpp"

#include <algorithm>
#include <cmath>

#include "common/bfloat16.hpp"
#include "common/check.hpp"
#include "kernels/elementwise.hpp"

namespace bigbatch::bf16_costs {
namespace {

void check_half(const char* what, DType dtype) {
  BIGBATCH_CHECK(is_half_width(dtype), what, ": the type must be f16 or bf16, got ",
                 dtype_name(dtype));
}

double squared_norm(const std::vector<float>& v) {
  double sum = 0;
  for (const float x : v) sum += static_cast<double>(x) * x;
  return sum;
}

}  // namespace

double unit_roundoff(DType dtype) {
  check_half("unit_roundoff", dtype);
  return dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
}

Accumulation::Accumulation(DType dtype) : dtype_(dtype) {
  check_half("Accumulation", dtype);
}

void Accumulation::add(const std::vector<Tensor>& term) {
  if (terms_ == 0) {
    for (const Tensor& t : term) {
      sum32_.push_back(Tensor::zeros(t.shape(), DType::f32));
      sum16_.push_back(Tensor::zeros(t.shape(), dtype_));
    }
  }
  BIGBATCH_CHECK(term.size() == sum32_.size(), "Accumulation::add: ", term.size(),
                 " tensors, the first term had ", sum32_.size());
  for (std::size_t t = 0; t < term.size(); ++t) {
    axpy(1.0f, term[t], sum32_[t]);
    const Tensor narrow(term[t].shape(), dtype_);
    cast(term[t], narrow);
    axpy(1.0f, narrow, sum16_[t]);  // rounded to the 16-bit type on store
    rounded_squares_ += squared_norm(term[t].to_vector<float>()) +
                        squared_norm(sum32_[t].to_vector<float>());
  }
  ++terms_;
}

double Accumulation::error() const {
  double error = 0, norm = 0;
  for (std::size_t t = 0; t < sum32_.size(); ++t) {
    const Tensor wide(sum16_[t].shape(), DType::f32);
    cast(sum16_[t], wide);
    const std::vector<float> a = wide.to_vector<float>(), b = sum32_[t].to_vector<float>();
    for (std::size_t i = 0; i < a.size(); ++i) error += std::pow(double{a[i]} - b[i], 2);
    norm += squared_norm(b);
  }
  return norm > 0 ? std::sqrt(error / norm) : 0.0;
}

double Accumulation::predicted() const {
  double norm = 0;
  for (const Tensor& s : sum32_) norm += squared_norm(s.to_vector<float>());
  return norm > 0 ? kRmsRelativeRounding * unit_roundoff(dtype_) * std::sqrt(rounded_squares_ / norm)
                  : 0.0;
}

double lost_update_share(const Tensor& before, const Tensor& after) {
  BIGBATCH_CHECK(before.dtype() == DType::f32 && after.dtype() == DType::f32 &&
                     before.shape() == after.shape(),
                 "lost_update_share: two f32 tensors of one shape, got ", before.describe(),
                 " and ", after.describe());
  const std::vector<float> a = before.to_vector<float>(), b = after.to_vector<float>();
  std::int64_t moved = 0, lost = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    ++moved;
    lost += to_bf16(b[i]) == to_bf16(a[i]) ? 1 : 0;
  }
  return moved == 0 ? 0.0 : static_cast<double>(lost) / static_cast<double>(moved);
}

double predicted_lost_share(double bound, double step) {
  BIGBATCH_CHECK(bound > 0 && step > 0, "predicted_lost_share: bound and step must be "
                 "positive, got ", bound, " and ", step);
  const double threshold = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(step))) + 9);
  return std::max(0.0, 1.0 - threshold / bound);
}

}  // namespace bigbatch::bf16_costs
