#include "kernels/optimizer.hpp"

#include <cmath>
#include <utility>
#include <vector>

#include "common/cpu_features.hpp"
#include "common/bfloat16.hpp"
#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/optimizer_math.hpp"

namespace bigbatch {
namespace {

using optimizer_math::AdamWScalars;
using optimizer_math::SgdScalars;

/// A tensor that must be defined, f32, shaped like param and on param's device.
void check_like_param(const char* op, const char* name, const Tensor& t, const Tensor& param) {
  BIGBATCH_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
  detail::check_dtype(op, name, t, DType::f32);
  detail::check_shape(op, name, t, param.shape());
  BIGBATCH_CHECK(t.device() == param.device(), op, ": ", name, " must be on ",
                 param.device().name(), " like param, got ", t.describe());
}

void check_half_copy(const char* op, const Tensor& half_copy, const Tensor& param) {
  if (!half_copy.defined()) return;
  BIGBATCH_CHECK(is_half_width(half_copy.dtype()), op, ": half_copy must be f16 or bf16, got ",
                 half_copy.describe());
  detail::check_shape(op, "half_copy", half_copy, param.shape());
  BIGBATCH_CHECK(half_copy.device() == param.device(), op, ": half_copy must be on ",
                 param.device().name(), " like param, got ", half_copy.describe());
}

/// Every element is read and written by one thread in one pass, so two operands that
/// share memory would silently mix old and new values: refuse them.
void check_disjoint(const char* op,
                    const std::vector<std::pair<const char*, const Tensor*>>& operands) {
  for (std::size_t i = 0; i < operands.size(); ++i) {
    for (std::size_t j = i + 1; j < operands.size(); ++j) {
      const Tensor& a = *operands[i].second;
      const Tensor& b = *operands[j].second;
      if (!a.defined() || !b.defined() || a.nbytes() == 0 || b.nbytes() == 0) continue;
      const auto* a_begin = static_cast<const char*>(a.raw_data());
      const auto* b_begin = static_cast<const char*>(b.raw_data());
      const bool overlap = a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
      BIGBATCH_CHECK(!overlap, op, ": ", operands[i].first, " and ", operands[j].first,
                     " share memory; they must be distinct tensors");
    }
  }
}

void check_step(const char* op, std::int64_t step) {
  BIGBATCH_CHECK(step >= 1, op, ": step counts optimizer steps from 1 (this one included), got ",
                 step);
}

// The option checks are written `!(x >= 0)` so that NaN is refused too.
void check_sgd_options(const SgdOptions& o) {
  BIGBATCH_CHECK(o.lr >= 0, "sgd_step: invalid learning rate ", o.lr, " (must be >= 0)");
  BIGBATCH_CHECK(o.momentum >= 0, "sgd_step: invalid momentum ", o.momentum, " (must be >= 0)");
  BIGBATCH_CHECK(o.weight_decay >= 0, "sgd_step: invalid weight_decay ", o.weight_decay,
                 " (must be >= 0)");
  BIGBATCH_CHECK(std::isfinite(o.dampening), "sgd_step: invalid dampening ", o.dampening);
  BIGBATCH_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                 "sgd_step: Nesterov momentum requires a momentum and zero dampening, got "
                 "momentum ",
                 o.momentum, ", dampening ", o.dampening);
}

void check_adamw_options(const AdamWOptions& o) {
  BIGBATCH_CHECK(o.lr >= 0, "adamw_step: invalid learning rate ", o.lr, " (must be >= 0)");
  BIGBATCH_CHECK(o.eps >= 0, "adamw_step: invalid eps ", o.eps, " (must be >= 0)");
  BIGBATCH_CHECK(o.beta1 >= 0 && o.beta1 < 1, "adamw_step: invalid beta1 ", o.beta1,
                 " (must be in [0, 1))");
  BIGBATCH_CHECK(o.beta2 >= 0 && o.beta2 < 1, "adamw_step: invalid beta2 ", o.beta2,
                 " (must be in [0, 1))");
  BIGBATCH_CHECK(o.weight_decay >= 0, "adamw_step: invalid weight_decay ", o.weight_decay,
                 " (must be >= 0)");
}

/// Elements per thread chunk: each costs a few ns, so smaller chunks lose to fork/join.
constexpr std::int64_t kGrain = 1 << 15;

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdOptions& options, std::int64_t step, const Tensor& half_copy) {
  const char* op = "sgd_step";
  BIGBATCH_CHECK(param.defined(), op, ": param is an undefined tensor");
  detail::check_dtype(op, "param", param, DType::f32);
  check_like_param(op, "grad", grad, param);
  check_sgd_options(options);
  check_step(op, step);
  if (options.momentum != 0) {
    BIGBATCH_CHECK(momentum_buffer.defined(), op, ": momentum ", options.momentum,
                   " needs a momentum_buffer, got an undefined tensor");
    check_like_param(op, "momentum_buffer", momentum_buffer, param);
  }
  check_half_copy(op, half_copy, param);
  const Tensor no_buffer;
  check_disjoint(op, {{"param", &param},
                      {"grad", &grad},
                      {"momentum_buffer", options.momentum != 0 ? &momentum_buffer : &no_buffer},
                      {"half_copy", &half_copy}});
  if (param.device().is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::sgd_step(param, grad, momentum_buffer, options, step, half_copy));
  }
  cpu::sgd_step(param, grad, momentum_buffer, options, step, half_copy);
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWOptions& options, std::int64_t step,
                const Tensor& half_copy) {
  const char* op = "adamw_step";
  BIGBATCH_CHECK(param.defined(), op, ": param is an undefined tensor");
  detail::check_dtype(op, "param", param, DType::f32);
  check_like_param(op, "grad", grad, param);
  check_like_param(op, "exp_avg", exp_avg, param);
  check_like_param(op, "exp_avg_sq", exp_avg_sq, param);
  check_adamw_options(options);
  check_step(op, step);
  check_half_copy(op, half_copy, param);
  check_disjoint(op, {{"param", &param},
                      {"grad", &grad},
                      {"exp_avg", &exp_avg},
                      {"exp_avg_sq", &exp_avg_sq},
                      {"half_copy", &half_copy}});
  if (param.device().is_cuda()) {
    BIGBATCH_RUN_CUDA(op,
                      cuda::adamw_step(param, grad, exp_avg, exp_avg_sq, options, step, half_copy));
  }
  cpu::adamw_step(param, grad, exp_avg, exp_avg_sq, options, step, half_copy);
}

// ---- the step's scalars, in double as Python computes them --------------------------

namespace optimizer_math {

SgdScalars sgd_scalars(const SgdOptions& o, std::int64_t step) {
  SgdScalars s{};
  s.weight_decay = static_cast<float>(o.weight_decay);
  s.momentum = static_cast<float>(o.momentum);
  s.one_minus_dampening = static_cast<float>(1 - o.dampening);
  s.negative_lr = static_cast<float>(-o.lr);
  s.apply_weight_decay = o.weight_decay != 0;
  s.use_momentum = o.momentum != 0;
  s.nesterov = o.nesterov;
  s.first_step = step == 1;
  return s;
}

AdamWScalars adamw_scalars(const AdamWOptions& o, std::int64_t step) {
  // Python: beta ** step with step a float (the step tensor's item()); both end in
  // the C library's pow.
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  AdamWScalars s{};
  s.decay_factor = static_cast<float>(1 - o.lr * o.weight_decay);
  s.lerp_weight = static_cast<float>(1 - o.beta1);
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - o.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(o.eps);
  s.negative_step_size = static_cast<float>(-(o.lr / bias_correction1));
  s.apply_weight_decay = o.weight_decay != 0;
  return s;
}

}  // namespace optimizer_math

// ---- CPU reference -------------------------------------------------------------------

namespace cpu {
namespace {

/// The working copy's element type: f16 or bf16 (f16 with a null pointer when none).
template <class Half>
struct SgdArrays {
  float* param;
  const float* grad;
  float* momentum_buffer;  // nullptr without momentum
  Half* half_copy;         // nullptr when not wanted
};

template <class Half>
struct AdamWArrays {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  Half* half_copy;  // nullptr when not wanted
};

/// The updated master rounded to the working copy's type, to nearest even.
inline f16 round_to(f16*, float x) { return static_cast<f16>(x); }
inline bf16 round_to(bf16*, float x) { return to_bf16(x); }

// The loops, written once and inlined into each instruction-set variant below, where
// the compiler turns std::fma and the 16-bit conversion into that variant's instructions.
template <class Half>
[[gnu::always_inline]] inline void sgd_range(const SgdArrays<Half>& a, const SgdScalars& s,
                                             std::int64_t begin, std::int64_t end) {
  const bool reads_buffer = a.momentum_buffer != nullptr && !s.first_step;
  for (std::int64_t i = begin; i < end; ++i) {
    const auto updated = optimizer_math::sgd_update(a.param[i], a.grad[i],
                                                    reads_buffer ? a.momentum_buffer[i] : 0.0f, s);
    a.param[i] = updated.param;
    if (a.momentum_buffer) a.momentum_buffer[i] = updated.momentum_buffer;
    if (a.half_copy) a.half_copy[i] = round_to(a.half_copy, updated.param);
  }
}

template <class Half>
[[gnu::always_inline]] inline void adamw_range(const AdamWArrays<Half>& a, const AdamWScalars& s,
                                               std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) {
    const auto updated =
        optimizer_math::adamw_update(a.param[i], a.grad[i], a.exp_avg[i], a.exp_avg_sq[i], s);
    a.param[i] = updated.param;
    a.exp_avg[i] = updated.exp_avg;
    a.exp_avg_sq[i] = updated.exp_avg_sq;
    if (a.half_copy) a.half_copy[i] = round_to(a.half_copy, updated.param);
  }
}

template <class Half>
void sgd_range_portable(const SgdArrays<Half>& a, const SgdScalars& s, std::int64_t begin,
                        std::int64_t end) {
  sgd_range(a, s, begin, end);
}
template <class Half>
[[gnu::target("avx2,fma,f16c")]] void sgd_range_avx2(const SgdArrays<Half>& a,
                                                     const SgdScalars& s, std::int64_t begin,
                                                     std::int64_t end) {
  sgd_range(a, s, begin, end);
}
template <class Half>
void adamw_range_portable(const AdamWArrays<Half>& a, const AdamWScalars& s, std::int64_t begin,
                          std::int64_t end) {
  adamw_range(a, s, begin, end);
}
template <class Half>
[[gnu::target("avx2,fma,f16c")]] void adamw_range_avx2(const AdamWArrays<Half>& a,
                                                       const AdamWScalars& s, std::int64_t begin,
                                                       std::int64_t end) {
  adamw_range(a, s, begin, end);
}

/// Calls body(Half{}) with the working copy's element type (f16 when there is none).
template <class Body>
void with_copy_type(const Tensor& half_copy, const Body& body) {
  if (half_copy.defined() && half_copy.dtype() == DType::bf16) return body(bf16{});
  body(f16{});
}

/// The copy's elements, or nullptr when there is none.
template <class Half>
Half* copy_data(const Tensor& half_copy) {
  return half_copy.defined() ? half_copy.data<Half>() : nullptr;
}

bool cpu_can_run(OptimizerPath path) {
  switch (path) {
    case OptimizerPath::portable: return true;
    case OptimizerPath::avx2:
      return cpu_supports(CpuFeature::avx2) && cpu_supports(CpuFeature::fma) &&
             cpu_supports(CpuFeature::f16c);
  }
  return false;
}

thread_local int forced_path = -1;  // an OptimizerPath set by ScopedOptimizerPath, or -1

}  // namespace

std::string_view optimizer_path_name(OptimizerPath path) {
  switch (path) {
    case OptimizerPath::portable: return "portable";
    case OptimizerPath::avx2: return "avx2";
  }
  return "?";
}

std::vector<OptimizerPath> optimizer_paths_supported() {
  std::vector<OptimizerPath> paths;
  for (const OptimizerPath path : {OptimizerPath::portable, OptimizerPath::avx2}) {
    if (cpu_can_run(path)) paths.push_back(path);
  }
  return paths;
}

OptimizerPath optimizer_path() {
  if (forced_path >= 0) return static_cast<OptimizerPath>(forced_path);
  static const OptimizerPath fastest = optimizer_paths_supported().back();
  return fastest;
}

ScopedOptimizerPath::ScopedOptimizerPath(OptimizerPath path) : previous_(forced_path) {
  BIGBATCH_CHECK(cpu_can_run(path), "ScopedOptimizerPath: this CPU cannot run the ",
                 optimizer_path_name(path), " optimizer path");
  forced_path = static_cast<int>(path);
}

ScopedOptimizerPath::~ScopedOptimizerPath() { forced_path = previous_; }

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdOptions& options, std::int64_t step, const Tensor& half_copy) {
  const SgdScalars s = optimizer_math::sgd_scalars(options, step);
  with_copy_type(half_copy, [&]<class Half>(Half) {
    const SgdArrays<Half> arrays{param.data<float>(), grad.data<float>(),
                                 s.use_momentum ? momentum_buffer.data<float>() : nullptr,
                                 copy_data<Half>(half_copy)};
    // Chosen here: the override is per calling thread, the chunks run on OpenMP's.
    const auto range = optimizer_path() == OptimizerPath::avx2 ? &sgd_range_avx2<Half>
                                                               : &sgd_range_portable<Half>;
    parallel_for(param.numel(), kGrain,
                 [&](std::int64_t begin, std::int64_t end) { range(arrays, s, begin, end); });
  });
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWOptions& options, std::int64_t step,
                const Tensor& half_copy) {
  const AdamWScalars s = optimizer_math::adamw_scalars(options, step);
  with_copy_type(half_copy, [&]<class Half>(Half) {
    const AdamWArrays<Half> arrays{param.data<float>(), grad.data<float>(),
                                   exp_avg.data<float>(), exp_avg_sq.data<float>(),
                                   copy_data<Half>(half_copy)};
    const auto range = optimizer_path() == OptimizerPath::avx2 ? &adamw_range_avx2<Half>
                                                               : &adamw_range_portable<Half>;
    parallel_for(param.numel(), kGrain,
                 [&](std::int64_t begin, std::int64_t end) { range(arrays, s, begin, end); });
  });
}

}  // namespace cpu
}  // namespace bigbatch
