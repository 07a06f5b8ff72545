// cpu_context.cpp: every benchmark program's JSON context names the machine's CPU, the
// instruction sets the kernels may use on it ("cpu") and the paths they take ("cpu_paths":
// the GEMM's, the optimizer's and the vector loops'), so that two results can be told apart
// by what made them. Linked into each benchmark program (bench/CMakeLists.txt).
#include <benchmark/benchmark.h>

#include "common/cpu_features.hpp"
#include "kernels/cpu_paths.hpp"

namespace {

[[maybe_unused]] const bool kCpuContextAdded = [] {
  benchmark::AddCustomContext("cpu", bigbatch::cpu_description());
  benchmark::AddCustomContext("cpu_paths", bigbatch::cpu::cpu_paths_in_use());
  return true;
}();

}  // namespace
