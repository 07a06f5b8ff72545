// step_counters.hpp: what bench_training's whole-step benchmarks share: skipping a CUDA
// benchmark where no device is, and the memory counters of the timed steps (exact, from
// the tracking allocator).
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <string>

#include "common/cuda_runtime.hpp"
#include "common/device.hpp"
#include "common/memory.hpp"

namespace bigbatch::bench {

/// True, and the benchmark reported as skipped with the reason, when `device` is CUDA and
/// no GPU is available.
inline bool skipped_without(benchmark::State& state, Device device) {
  std::string why_not;
  if (!device.is_cuda() || cuda_rt::available(&why_not)) return false;
  state.SkipWithError(("skipped: " + why_not).c_str());
  return true;
}

/// The memory of the timed steps: made after the warm-up (the peaks start there), written
/// as counters after the timed loop.
class StepMemory {
 public:
  explicit StepMemory(Device device)
      : allocator_(allocator_for(device)),
        activations_before_(allocator_.stats().live_of(MemoryCategory::activations)) {
    allocator_.reset_peak();
  }
  /// The allocator's books now.
  MemoryStats stats() const { return allocator_.stats(); }
  /// peak_total (the device's peak) and activations_peak (the most bytes of saved
  /// activations alive at once, above those alive before the timed steps).
  void write(benchmark::State& state) const {
    const MemoryStats now = stats();
    state.counters["peak_total"] = static_cast<double>(now.peak_total);
    state.counters["activations_peak"] =
        static_cast<double>(now.peak_of(MemoryCategory::activations) - activations_before_);
  }

 private:
  TrackingAllocator& allocator_;
  std::size_t activations_before_;
};

}  // namespace bigbatch::bench
