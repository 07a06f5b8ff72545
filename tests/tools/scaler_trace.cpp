// scaler_trace: chapter 04's DynamicLossScaler driven by a sequence of optimizer steps that
// did (1) or did not (0) overflow, for scripts/compare_with_gradscaler.py. Prints, per step,
// the scale the next step uses and the clean-step count, one line "SCALE COUNT" each.
//
// Usage: scaler_trace INIT GROWTH BACKOFF INTERVAL FLAGS    e.g. 65536 2 0.5 3 0010110
// (hysteresis 1, no minimum, float's largest as the maximum: GradScaler's rule up to the
// top of float's range, where GradScaler refuses a growth to inf and ours clamps it).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>

#include "chapters/04_dynamic_loss_scaling/dynamic_loss_scaler.hpp"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s INIT GROWTH BACKOFF INTERVAL FLAGS\n", argv[0]);
    return 2;
  }
  try {
    bigbatch::loss_scaling::DynamicScalerOptions options;
    options.initial_scale = std::stof(argv[1]);
    options.growth_factor = std::stof(argv[2]);
    options.backoff_factor = std::stof(argv[3]);
    options.growth_interval = std::stoll(argv[4]);
    options.min_scale = 1e-30f;
    options.max_scale = std::numeric_limits<float>::max();
    bigbatch::loss_scaling::DynamicLossScaler scaler(options);
    for (const char flag : std::string(argv[5])) {
      if (flag != '0' && flag != '1') throw std::invalid_argument("FLAGS: 0s and 1s only");
      scaler.update(flag == '1');
      std::printf("%.9g %lld\n", static_cast<double>(scaler.scale()),
                  static_cast<long long>(scaler.clean_steps_in_a_row()));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scaler_trace: %s\n", e.what());
    return 2;
  }
  return 0;
}
