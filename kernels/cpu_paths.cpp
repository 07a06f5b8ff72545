#include "kernels/cpu_paths.hpp"

#include "kernels/cpu_vector.hpp"
#include "kernels/gemm.hpp"
#include "kernels/optimizer.hpp"

namespace bigbatch::cpu {

std::string cpu_paths_in_use() {
  return "GEMM " + std::string(gemm_path_name(gemm_path())) + ", optimizer " +
         std::string(optimizer_path_name(optimizer_path())) + ", vector loops " +
         std::string(simd_level_name(simd_level()));
}

}  // namespace bigbatch::cpu
