// gemm_epilogue.cu: the fused GEMM epilogues through cuBLASLt (the contract is in
// gemm_epilogue.hpp).
//
// Row-major tensors are column-major transposes (as in gemm.cu), so each call asks cuBLASLt
// for a column-major D^T [N, M] with leading dimension N:
//   forward   D^T = op(w) x^T:  A = w stored [K, N] column-major (lda K), transposed;
//             B = x stored [K, M] (ldb K); m = N, n = M, k = K. The bias runs along D^T's
//             rows (length N), as cuBLASLt's bias does; aux (pre) has D's layout (ld N).
//   backward  D^T = w^T dy^T:   A = w stored [N, N2] column-major (lda N), not transposed;
//             B = dy stored [N2, M] (ldb N2); m = N, n = M, k = N2; aux (pre) ld N.
// fp32 accumulation (CUBLAS_COMPUTE_32F, fp32 scale), f16 A, B, C, D and aux.
// The work runs on the legacy default stream, in order with every other kernel.
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cublas_library.cuh"
#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_epilogue.hpp"

namespace bigbatch::cuda {
namespace {

void check_lt(cublasStatus_t status, const char* what) {
  check_cublas(status, "cuBLASLt", what);
}

/// The process's cuBLASLt handle (device 0, the one device tensors live on), created on first
/// use and kept: destroying it from a static destructor could run after the runtime is gone.
cublasLtHandle_t lt_handle() {
  static std::once_flag once;
  static cublasLtHandle_t handle = nullptr;
  std::call_once(once, [] {
    check_lt(cublas_library().cublasLtCreate(&handle), "cublasLtCreate");
  });
  return handle;
}

/// Bytes of scratch cuBLASLt may use per call (taken from the caching allocator).
constexpr std::size_t kWorkspaceBytes = std::size_t{4} << 20;

/// The descriptors of one call, destroyed with it.
class MatmulCall {
 public:
  MatmulCall() {
    check_lt(lt_.cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
             "cublasLtMatmulDescCreate");
    check_lt(lt_.cublasLtMatmulPreferenceCreate(&preference_),
             "cublasLtMatmulPreferenceCreate");
  }
  ~MatmulCall() {
    for (cublasLtMatrixLayout_t layout : {a_, b_, d_}) {
      if (layout != nullptr) lt_.cublasLtMatrixLayoutDestroy(layout);
    }
    lt_.cublasLtMatmulPreferenceDestroy(preference_);
    lt_.cublasLtMatmulDescDestroy(desc_);
  }
  MatmulCall(const MatmulCall&) = delete;
  MatmulCall& operator=(const MatmulCall&) = delete;

  /// Sets a descriptor attribute from a value.
  template <class V>
  void set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    check_lt(lt_.cublasLtMatmulDescSetAttribute(desc_, attribute, &value, sizeof value),
             "cublasLtMatmulDescSetAttribute");
  }

  /// D (m x n, ld m) = op(A) op(B) with the attributes set; A is (transa ? k x m : m x k)
  /// stored with leading dimension lda, B is k x n with ldb. False when cuBLASLt offers no
  /// algorithm for it (nothing was launched).
  bool run(bool transa, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
           std::int64_t lda, const void* b, std::int64_t ldb, void* d, const Device& device) {
    const cublasOperation_t op_a = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = CUBLAS_OP_N;
    set(CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    check_lt(lt_.cublasLtMatrixLayoutCreate(&a_, CUDA_R_16F, transa ? k : m, transa ? m : k,
                                            lda),
             "cublasLtMatrixLayoutCreate (A)");
    check_lt(lt_.cublasLtMatrixLayoutCreate(&b_, CUDA_R_16F, k, n, ldb),
             "cublasLtMatrixLayoutCreate (B)");
    check_lt(lt_.cublasLtMatrixLayoutCreate(&d_, CUDA_R_16F, m, n, m),
             "cublasLtMatrixLayoutCreate (D)");
    const std::uint64_t workspace_bytes = kWorkspaceBytes;
    check_lt(lt_.cublasLtMatmulPreferenceSetAttribute(preference_,
                                                      CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes, sizeof workspace_bytes),
             "cublasLtMatmulPreferenceSetAttribute");
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t status = lt_.cublasLtMatmulAlgoGetHeuristic(
        lt_handle(), desc_, a_, b_, d_, d_, preference_, 1, &heuristic, &found);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;
    const Tensor workspace({static_cast<std::int64_t>(kWorkspaceBytes / sizeof(float))},
                           DType::f32, device, MemoryCategory::workspace);
    const float alpha = 1.0f, beta = 0.0f;
    const int timing = begin_gemm_timing();
    check_lt(lt_.cublasLtMatmul(lt_handle(), desc_, &alpha, a, a_, b, b_, &beta, d, d_, d, d_,
                                &heuristic.algo, workspace.raw_data(), kWorkspaceBytes, 0),
             "cublasLtMatmul");
    end_gemm_timing(timing);
    return true;
  }

 private:
  const CublasLibrary& lt_ = cublas_library();
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
};

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

/// The sizes cuBLASLt's GELU aux needs: its leading dimension (N) a multiple of 8, every
/// address 16-byte aligned, and every size within int64 arithmetic (always) and non-zero.
bool fusable(std::int64_t n, std::int64_t m, std::int64_t k,
             std::initializer_list<const Tensor*> tensors) {
  if (n % 8 != 0 || m == 0 || n == 0 || k == 0) return false;
  for (const Tensor* t : tensors) {
    if (!aligned16(t->raw_data())) return false;
  }
  return true;
}

}  // namespace

bool fused_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& pre, const Tensor& y) {
  const std::int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  if (!fusable(N, M, K, {&x, &w, &pre, &y})) return false;
  // cuBLASLt takes the bias in D's type (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
  const Tensor bias16({N}, DType::f16, x.device(), MemoryCategory::workspace);
  ::bigbatch::cast(bias, bias16);
  MatmulCall call;
  call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  call.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias16.raw_data()));
  call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, pre.raw_data());
  call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t{N});
  return call.run(/*transa=*/true, N, M, K, w.raw_data(), K, x.raw_data(), K, y.raw_data(),
                  x.device());
}

bool fused_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dh) {
  const std::int64_t M = dy.dim(0), N2 = dy.dim(1), N = w.dim(1);
  if (!fusable(N, M, N2, {&dy, &w, &pre, &dh})) return false;
  MatmulCall call;
  call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DGELU);
  call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(pre.raw_data()));
  call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t{N});
  return call.run(/*transa=*/false, N, M, N2, w.raw_data(), N, dy.raw_data(), N2, dh.raw_data(),
                  dy.device());
}

}  // namespace bigbatch::cuda
