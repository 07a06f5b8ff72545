// gemm.cu: the CUDA GEMM, one cublasGemmEx call (see gemm.hpp for the contract).
//
// cuBLAS is column-major and our tensors are row-major. A row-major [M, N] matrix has
// the same bytes as a column-major [N, M] one, its transpose, so we ask cuBLAS for
//   C^T = op(B)^T op(A)^T      (column-major, [N, M], leading dimension N)
// with B as the first operand and A as the second; each operand's own transpose flag
// carries over unchanged.
//
// Precision: f32 uses CUBLAS_COMPUTE_32F_PEDANTIC, which forbids TF32 and every other
// reduced-precision shortcut, so the result is true fp32 arithmetic. f16 and bf16 operands
// (CUDA_R_16F, CUDA_R_16BF) use CUBLAS_COMPUTE_32F: tensor cores multiply the 16-bit values
// exactly and accumulate in fp32; a 16-bit C is rounded once when stored (the handle's math
// mode disallows reductions in reduced precision). With beta == 0 cuBLAS does not read C.
#include <climits>
#include <mutex>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cublas_library.cuh"
#include "kernels/cuda_common.cuh"
#include "kernels/gemm.hpp"
#include "kernels/gemm_internal.hpp"

namespace bigbatch::cuda {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " +
                             cudaGetErrorString(status));
  }
}

/// Makes `device` current for the scope, as cuBLAS works on the current device.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    changed_ = previous_ != device;
    if (changed_) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~CurrentDevice() {
    if (changed_) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

/// The cuBLAS handle of the current device (`device`), created on first use and kept
/// for the life of the process: creating one is costly, and destroying it from a static
/// destructor could run after the CUDA runtime has shut down.
cublasHandle_t handle_for(int device) {
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;
  const std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(handles.size())) handles.resize(device + 1, nullptr);
  if (handles[device] == nullptr) {
    const CublasLibrary& blas = cublas_library();
    check_cublas(blas.cublasCreate_v2(&handles[device]), "cuBLAS", "cublasCreate");
    // Without this flag cuBLAS may reduce partial sums in the output's type (f16 for an
    // f16 C), which would break the one rounding on store that gemm.hpp promises.
    check_cublas(blas.cublasSetMathMode(handles[device],
                                        CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION),
                 "cuBLAS", "cublasSetMathMode");
  }
  return handles[device];
}

/// K == 0: C = beta * C, or 0 when beta == 0 (C not read).
template <class T>
__global__ void scale_kernel(T* c, std::int64_t n, float beta) {
  for (const std::int64_t i : grid_stride(n)) {
    c[i] = from_float<T>(beta == 0.0f ? 0.0f : beta * to_float(c[i]));
  }
}

template <class T>
void launch_scale(const Tensor& c, float beta) {
  scale_kernel<<<grid_for(c.numel()), kThreadsPerBlock>>>(c.data<T>(), c.numel(), beta);
  BIGBATCH_CHECK_LAUNCH("gemm scale_kernel");
}

int as_int(std::int64_t value, const char* name) {
  BIGBATCH_CHECK(value <= INT_MAX, "cuda::gemm: ", name, " = ", value,
                 " exceeds what cuBLAS takes (INT_MAX)");
  return static_cast<int>(value);
}

/// The events of the timed GEMMs (set_gemm_timing): a start and an end per call, reused.
struct GemmTimer {
  std::mutex mutex;
  bool enabled = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events;  // created on demand, kept
  std::size_t used = 0;                                      // pairs recorded since the take
};

GemmTimer& gemm_timer() {
  static GemmTimer& timer = *new GemmTimer();  // never destroyed: events outlive no runtime
  return timer;
}

}  // namespace

void set_gemm_timing(bool enabled) {
  GemmTimer& timer = gemm_timer();
  const std::lock_guard<std::mutex> lock(timer.mutex);
  timer.enabled = enabled;
}

int begin_gemm_timing() {
  GemmTimer& timer = gemm_timer();
  const std::lock_guard<std::mutex> lock(timer.mutex);
  if (!timer.enabled) return -1;
  if (timer.used == timer.events.size()) {
    std::pair<cudaEvent_t, cudaEvent_t> pair{};
    check_cuda(cudaEventCreate(&pair.first), "cudaEventCreate");
    check_cuda(cudaEventCreate(&pair.second), "cudaEventCreate");
    timer.events.push_back(pair);
  }
  check_cuda(cudaEventRecord(timer.events[timer.used].first, 0), "cudaEventRecord");
  return static_cast<int>(timer.used++);
}

void end_gemm_timing(int index) {
  if (index < 0) return;
  GemmTimer& timer = gemm_timer();
  const std::lock_guard<std::mutex> lock(timer.mutex);
  check_cuda(cudaEventRecord(timer.events[static_cast<std::size_t>(index)].second, 0),
             "cudaEventRecord");
}

double take_gemm_milliseconds() {
  GemmTimer& timer = gemm_timer();
  const std::lock_guard<std::mutex> lock(timer.mutex);
  double total = 0;
  for (std::size_t k = 0; k < timer.used; ++k) {
    float ms = 0;
    check_cuda(cudaEventSynchronize(timer.events[k].second), "cudaEventSynchronize");
    check_cuda(cudaEventElapsedTime(&ms, timer.events[k].first, timer.events[k].second),
               "cudaEventElapsedTime");
    total += ms;
  }
  timer.used = 0;
  return total;
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha, float beta) {
  const auto sizes = gemm_detail::check_gemm_arguments("cuda::gemm", a, trans_a, b, trans_b, c);
  BIGBATCH_CHECK(a.device().is_cuda() && b.device() == a.device() && c.device() == a.device(),
                 "cuda::gemm: all tensors must be on one CUDA device, got A ", a.describe(),
                 ", B ", b.describe(), ", C ", c.describe());
  if (sizes.m == 0 || sizes.n == 0) return;
  const CurrentDevice current(a.device().index);
  if (sizes.k == 0) {
    return dispatch_floating("cuda::gemm", c.dtype(),
                            [&]<class T>(ElementType<T>) { launch_scale<T>(c, beta); });
  }

  const auto cuda_type = [](DType dtype) {
    return dtype == DType::f16 ? CUDA_R_16F : dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  };
  const cudaDataType operand_type = cuda_type(a.dtype());
  const cudaDataType output_type = cuda_type(c.dtype());
  const cublasComputeType_t compute =
      a.dtype() == DType::f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  // Column-major view: C^T [N, M] = op(B)^T [N, K] x op(A)^T [K, M]. A stored row of
  // length ld is a stored column of length ld, so each leading dimension is the
  // operand's row length, dim(1).
  const int timing = begin_gemm_timing();
  check_cublas(
      cublas_library().cublasGemmEx(
          handle_for(a.device().index), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
          trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(sizes.n, "N"), as_int(sizes.m, "M"),
          as_int(sizes.k, "K"), &alpha, b.raw_data(), operand_type, as_int(b.dim(1), "ldb"),
          a.raw_data(), operand_type, as_int(a.dim(1), "lda"), &beta, c.raw_data(),
          output_type, as_int(sizes.n, "ldc"), compute, CUBLAS_GEMM_DEFAULT),
      "cuBLAS", "cublasGemmEx");
  end_gemm_timing(timing);
}

}  // namespace bigbatch::cuda
