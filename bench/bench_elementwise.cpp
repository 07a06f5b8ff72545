// bench_elementwise.cpp: the elementwise ops against memcpy, on 64 MiB buffers.
//
// An elementwise op over a large buffer should run at the speed of memory, and the
// fairest yardstick of that speed is a copy of the same bytes: std::memcpy on the CPU
// (split over the same threads as our ops, with the same parallel_for, so the peer is
// at its best), cudaMemcpy device-to-device on the GPU. Each benchmark times its op
// and, interleaved with it in every iteration, the copy of 64 MiB, so that both see
// the same machine load; it reports
//   bytes_per_second   bytes the op reads plus bytes it writes, per second
//   memcpy_bytes_per_second   the copy, counted the same way (64 MiB read + 64 MiB written)
//   vs_memcpy          the ratio of the two (the target on the CPU: at least 0.5)
//   threads            the CPU threads both use
// The CUDA benchmarks skip, with the reason, where no GPU answers.
//
//   ./bench_kernels --benchmark_filter=Elementwise --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true   (one command line)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/cuda_runtime.hpp"
#include "common/tensor.hpp"
#include "kernels/activation.hpp"
#include "kernels/bias.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dropout.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/fill.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kElements = std::int64_t{16} << 20;  // 16 Mi floats = 64 MiB
constexpr std::int64_t kFloatBytes = kElements * 4;
constexpr std::int64_t kHalfBytes = kElements * 2;
constexpr std::int64_t kBiasColumns = 1024;

/// A CPU or CUDA f32/f16 tensor of kElements elements, filled with `value`.
Tensor buffer(Device device, DType dtype, double value) {
  Tensor t({kElements}, dtype, device);
  fill(t, value);
  return t;
}

/// The peer: copies 64 MiB, on the CPU over the same threads as the ops.
class MemcpyPeer {
 public:
  explicit MemcpyPeer(Device device)
      : device_(device),
        src_(buffer(device, DType::f32, 1.0)),
        dst_(buffer(device, DType::f32, 0.0)) {}

  void copy() const {
    if (device_.is_cuda()) {
      cuda_rt::memcpy(dst_.raw_data(), src_.raw_data(), kFloatBytes,
                      cuda_rt::CopyKind::device_to_device);
      cuda_rt::synchronize();
      return;
    }
    const auto* in = static_cast<const char*>(src_.raw_data());
    auto* out = static_cast<char*>(dst_.raw_data());
    cpu::parallel_for(kFloatBytes, cpu::kElementwiseGrain * 4,
                      [&](std::int64_t begin, std::int64_t end) {
                        std::memcpy(out + begin, in + begin, static_cast<std::size_t>(end - begin));
                      });
  }
  static constexpr std::int64_t bytes_moved() { return 2 * kFloatBytes; }

 private:
  Device device_;
  Tensor src_, dst_;
};

/// True (and the benchmark marked skipped, with the reason) for CUDA without a GPU.
bool skip_without_gpu(benchmark::State& state, Device device) {
  std::string why_not;
  if (device.is_cpu() || cuda_rt::available(&why_not)) return false;
  state.SkipWithError(("no GPU: " + why_not).c_str());
  return true;
}

double seconds_of(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Times `op` (which moves `bytes_moved` bytes) against the memcpy peer, interleaved.
void run_against_memcpy(benchmark::State& state, Device device, std::int64_t bytes_moved,
                        const std::function<void()>& op) {
  const MemcpyPeer peer(device);
  const auto synchronized_op = [&] {
    op();
    if (device.is_cuda()) cuda_rt::synchronize();
  };
  synchronized_op();  // warm up: page faults, first launch
  peer.copy();
  double op_seconds = 0, peer_seconds = 0;
  for (auto _ : state) {
    const double t = seconds_of(synchronized_op);
    state.SetIterationTime(t);
    op_seconds += t;
    peer_seconds += seconds_of([&] { peer.copy(); });
  }
  const auto iterations = static_cast<double>(state.iterations());
  state.SetBytesProcessed(state.iterations() * bytes_moved);
  const double op_rate = bytes_moved * iterations / op_seconds;
  const double peer_rate = MemcpyPeer::bytes_moved() * iterations / peer_seconds;
  state.counters["memcpy_bytes_per_second"] = peer_rate;
  state.counters["vs_memcpy"] = op_rate / peer_rate;
  state.counters["threads"] = device.is_cpu() ? cpu::max_threads() : 0;
}

// ---- the benchmarks ---------------------------------------------------------------

void Elementwise_memcpy(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const MemcpyPeer peer(device);
  peer.copy();
  for (auto _ : state) state.SetIterationTime(seconds_of([&] { peer.copy(); }));
  state.SetBytesProcessed(state.iterations() * MemcpyPeer::bytes_moved());
  state.counters["threads"] = device.is_cpu() ? cpu::max_threads() : 0;
}

void Elementwise_fill(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor x = buffer(device, DType::f32, 0.0);
  run_against_memcpy(state, device, kFloatBytes, [&] { fill(x, 1.0); });
}

void Elementwise_scale(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor x = buffer(device, DType::f32, 1.0);
  // alternating factors keep the values finite and away from subnormals
  bool up = true;
  run_against_memcpy(state, device, 2 * kFloatBytes, [&] {
    scale(x, up ? 2.0f : 0.5f);
    up = !up;
  });
}

void Elementwise_axpy(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor x = buffer(device, DType::f32, 1.0), y = buffer(device, DType::f32, 0.0);
  run_against_memcpy(state, device, 3 * kFloatBytes, [&] { axpy(0.5f, x, y); });
}

void Elementwise_add_bias(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor y =
      buffer(device, DType::f32, 0.0).reshaped({kElements / kBiasColumns, kBiasColumns});
  Tensor bias({kBiasColumns}, DType::f32, device);
  fill(bias, 0.0);
  run_against_memcpy(state, device, 2 * kFloatBytes, [&] { add_bias(y, bias); });
}

void Elementwise_bias_backward(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor dy =
      buffer(device, DType::f32, 0.25).reshaped({kElements / kBiasColumns, kBiasColumns});
  Tensor dbias({kBiasColumns}, DType::f32, device);
  fill(dbias, 0.0);
  run_against_memcpy(state, device, kFloatBytes, [&] { bias_backward(dy, dbias); });
}

void Elementwise_gelu_forward(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor x = buffer(device, DType::f32, -0.75), y = buffer(device, DType::f32, 0.0);
  run_against_memcpy(state, device, 2 * kFloatBytes, [&] { gelu_forward(x, y); });
}

void Elementwise_gelu_backward(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor x = buffer(device, DType::f32, -0.75), dy = buffer(device, DType::f32, 1.0);
  const Tensor dx = buffer(device, DType::f32, 0.0);
  run_against_memcpy(state, device, 3 * kFloatBytes, [&] { gelu_backward(x, dy, dx); });
}

void Elementwise_relu_forward(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor x = buffer(device, DType::f32, -0.75), y = buffer(device, DType::f32, 0.0);
  run_against_memcpy(state, device, 2 * kFloatBytes, [&] { relu_forward(x, y); });
}

void Elementwise_relu_backward(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor x = buffer(device, DType::f32, 0.75), dy = buffer(device, DType::f32, 1.0);
  const Tensor dx = buffer(device, DType::f32, 0.0);
  run_against_memcpy(state, device, 3 * kFloatBytes, [&] { relu_backward(x, dy, dx); });
}

void Elementwise_dropout_forward(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor x = buffer(device, DType::f32, 1.0), y = buffer(device, DType::f32, 0.0);
  const DropoutSpec spec{0.1f, 1234, 7, 0};
  run_against_memcpy(state, device, 2 * kFloatBytes, [&] { dropout_forward(x, y, spec); });
}

void Elementwise_dropout_backward(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor dy = buffer(device, DType::f32, 1.0), dx = buffer(device, DType::f32, 0.0);
  const DropoutSpec spec{0.1f, 1234, 7, 0};
  run_against_memcpy(state, device, 2 * kFloatBytes, [&] { dropout_backward(dy, dx, spec); });
}

void Elementwise_cast_f32_to_f16(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor src = buffer(device, DType::f32, 0.1), dst = buffer(device, DType::f16, 0.0);
  run_against_memcpy(state, device, kFloatBytes + kHalfBytes, [&] { cast(src, dst); });
}

void Elementwise_cast_f16_to_f32(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  const Tensor src = buffer(device, DType::f16, 0.1), dst = buffer(device, DType::f32, 0.0);
  run_against_memcpy(state, device, kHalfBytes + kFloatBytes, [&] { cast(src, dst); });
}

void Elementwise_unscale_and_check_finite(benchmark::State& state, Device device) {
  if (skip_without_gpu(state, device)) return;
  // four gradient tensors of 16 MiB each: 64 MiB in all
  std::vector<Tensor> grads;
  for (int k = 0; k < 4; ++k) {
    grads.push_back(Tensor({kElements / 4}, DType::f32, device));
    fill(grads.back(), 1.0);
  }
  Tensor found_inf({1}, DType::f32, device);
  fill(found_inf, 0.0);
  bool up = true;
  run_against_memcpy(state, device, 2 * kFloatBytes, [&] {
    unscale_and_check_finite(grads, up ? 2.0f : 0.5f, found_inf);
    up = !up;
  });
}

#define BIGBATCH_ELEMENTWISE_BENCH(name)                                                       \
  BENCHMARK_CAPTURE(name, cpu, Device::cpu())->UseManualTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(name, cuda, Device::cuda())->UseManualTime()->Unit(benchmark::kMillisecond)

BIGBATCH_ELEMENTWISE_BENCH(Elementwise_memcpy);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_fill);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_scale);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_axpy);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_add_bias);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_bias_backward);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_gelu_forward);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_gelu_backward);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_relu_forward);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_relu_backward);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_dropout_forward);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_dropout_backward);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_cast_f32_to_f16);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_cast_f16_to_f32);
BIGBATCH_ELEMENTWISE_BENCH(Elementwise_unscale_and_check_finite);

}  // namespace
}  // namespace bigbatch
