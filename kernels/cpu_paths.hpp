// cpu_paths.hpp: which instruction-set path each CPU kernel family takes in this process,
// in one line for logs and reports (the choices are made in gemm.cpp, optimizer.cpp and
// cpu_vector.hpp, from common/cpu_features.hpp).
#pragma once

#include <string>

namespace bigbatch::cpu {

/// The paths the calling thread's CPU kernels take now, e.g.
/// "GEMM avx512, optimizer avx2, vector loops AVX-512".
std::string cpu_paths_in_use();

}  // namespace bigbatch::cpu
