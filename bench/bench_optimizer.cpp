// bench_optimizer: one SGD (momentum) or AdamW step over n fp32 parameters, with the
// fp16 working copy written in the same pass, on each CPU path and on CUDA. A step is
// memory bound, so the figure of merit is bytes moved per second:
//   SGD   reads param, grad, buffer; writes param, buffer, half    (4+4+4 + 4+4+2 = 22 B)
//   AdamW reads param, grad, m, v; writes param, m, v, half        (16 + 14 = 30 B)
// Run: bench_kernels --benchmark_filter=Optimizer --benchmark_out=optimizer.json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <optional>
#include <string>

#include "common/cuda_runtime.hpp"
#include "kernels/fill.hpp"
#include "kernels/optimizer.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kSgdBytesPerElement = 22;
constexpr std::int64_t kAdamWBytesPerElement = 30;

/// Where a benchmark runs: a CPU path, or CUDA.
struct Target {
  Device device;
  cpu::OptimizerPath path = cpu::OptimizerPath::portable;  // CPU only
};

/// Forces the target's CPU path for the benchmark's lifetime; skips the benchmark,
/// with the reason, when this machine cannot run the target.
std::optional<cpu::ScopedOptimizerPath> enter(benchmark::State& state, const Target& target) {
  std::string why_not;
  if (target.device.is_cuda()) {
    if (!cuda_rt::available(&why_not)) state.SkipWithError(("skipped: " + why_not).c_str());
    return std::nullopt;
  }
  const auto supported = cpu::optimizer_paths_supported();
  if (std::find(supported.begin(), supported.end(), target.path) == supported.end()) {
    state.SkipWithError("skipped: this CPU cannot run the path");
    return std::nullopt;
  }
  return std::optional<cpu::ScopedOptimizerPath>(std::in_place, target.path);
}

Tensor filled(std::int64_t n, DType dtype, Device device, double value) {
  Tensor t({n}, dtype, device);
  fill(t, value);
  return t;
}

/// Waits for the GPU inside the timed loop, so that every step's kernel is timed.
void wait_for(Device device) {
  if (device.is_cuda()) cuda_rt::synchronize();
}

void finish(benchmark::State& state, std::int64_t n, std::int64_t bytes_per_element) {
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * bytes_per_element);
}

void BM_OptimizerSgdMomentum(benchmark::State& state, Target target) {
  const auto scoped_path = enter(state, target);
  if (state.error_occurred()) return;
  const Device device = target.device;
  const std::int64_t n = state.range(0);
  const Tensor param = filled(n, DType::f32, device, 0.5);
  const Tensor grad = filled(n, DType::f32, device, 1e-3);
  const Tensor buffer = filled(n, DType::f32, device, 0);
  const Tensor half = filled(n, DType::f16, device, 0);
  const SgdOptions options{.lr = 1e-3, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true};
  std::int64_t step = 1;
  for (auto _ : state) {
    sgd_step(param, grad, buffer, options, step++, half);
    wait_for(device);
  }
  finish(state, n, kSgdBytesPerElement);
}

void BM_OptimizerAdamW(benchmark::State& state, Target target) {
  const auto scoped_path = enter(state, target);
  if (state.error_occurred()) return;
  const Device device = target.device;
  const std::int64_t n = state.range(0);
  const Tensor param = filled(n, DType::f32, device, 0.5);
  const Tensor grad = filled(n, DType::f32, device, 1e-3);
  const Tensor exp_avg = filled(n, DType::f32, device, 0);
  const Tensor exp_avg_sq = filled(n, DType::f32, device, 0);
  const Tensor half = filled(n, DType::f16, device, 0);
  std::int64_t step = 1;
  for (auto _ : state) {
    adamw_step(param, grad, exp_avg, exp_avg_sq, AdamWOptions{}, step++, half);
    wait_for(device);
  }
  finish(state, n, kAdamWBytesPerElement);
}

const Target kCpuPortable{Device::cpu(), cpu::OptimizerPath::portable};
const Target kCpuAvx2{Device::cpu(), cpu::OptimizerPath::avx2};
const Target kCuda{Device::cuda()};

BENCHMARK_CAPTURE(BM_OptimizerSgdMomentum, cpu_portable, kCpuPortable)->Arg(1 << 22)->UseRealTime();
BENCHMARK_CAPTURE(BM_OptimizerSgdMomentum, cpu_avx2, kCpuAvx2)->Arg(1 << 22)->UseRealTime();
BENCHMARK_CAPTURE(BM_OptimizerSgdMomentum, cuda, kCuda)->Arg(1 << 24)->UseRealTime();
BENCHMARK_CAPTURE(BM_OptimizerAdamW, cpu_portable, kCpuPortable)->Arg(1 << 22)->UseRealTime();
BENCHMARK_CAPTURE(BM_OptimizerAdamW, cpu_avx2, kCpuAvx2)->Arg(1 << 22)->UseRealTime();
BENCHMARK_CAPTURE(BM_OptimizerAdamW, cuda, kCuda)->Arg(1 << 24)->UseRealTime();

}  // namespace
}  // namespace bigbatch
