// cublas_library.cuh: cuBLAS and cuBLASLt, opened the first time a GEMM runs on a GPU.
//
// Linked the usual way, the two libraries load with every program that holds the CUDA
// backend, GPU or not, and set themselves up before main runs: 0.1 s and 220 MB of memory
// for a program that returns at once (an empty main linked with cuBLAS took 95 ms here;
// `bigbatch --version` takes 6 ms without it). A test suite, a check script or a CI run
// starts such programs thousands of times on machines without a GPU, where the libraries
// never do any work.
// So no program links them: the GEMMs call them through cublas_library(), which opens
// them with dlopen on its first call and looks up each function this project uses; their
// types come from the libraries' own headers (decltype), so a call through the table is
// checked as a direct call is. PyTorch opens NVRTC and the driver the same way.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace bigbatch::cuda {

/// The cuBLAS and cuBLASLt functions this project calls, each named as in the headers
/// (cublasCreate is a macro for cublasCreate_v2, the function the library exports).
struct CublasLibrary {
  /// A cuBLAS handle (cublasCreate).
  decltype(&::cublasCreate_v2) cublasCreate_v2;
  /// Sets a handle's math mode.
  decltype(&::cublasSetMathMode) cublasSetMathMode;
  /// The GEMM of gemm.cu. Overloaded in C++ (an inline wrapper in the header takes a
  /// cudaDataType compute type): the function the library exports takes a
  /// cublasComputeType_t. The .cu file checks that this type selects one of the header's
  /// declarations.
  cublasStatus_t (*cublasGemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m,
                                 int n, int k, const void* alpha, const void* a, cudaDataType,
                                 int lda, const void* b, cudaDataType, int ldb,
                                 const void* beta, void* c, cudaDataType, int ldc,
                                 cublasComputeType_t, cublasGemmAlgo_t);
  /// A status's name ("CUBLAS_STATUS_INVALID_VALUE").
  decltype(&::cublasGetStatusName) cublasGetStatusName;
  /// A status in words.
  decltype(&::cublasGetStatusString) cublasGetStatusString;

  /// A cuBLASLt handle.
  decltype(&::cublasLtCreate) cublasLtCreate;
  /// A matmul's descriptor (gemm_epilogue.cu).
  decltype(&::cublasLtMatmulDescCreate) cublasLtMatmulDescCreate;
  /// Frees a matmul's descriptor.
  decltype(&::cublasLtMatmulDescDestroy) cublasLtMatmulDescDestroy;
  /// Sets an attribute of a matmul's descriptor (its epilogue, bias, aux).
  decltype(&::cublasLtMatmulDescSetAttribute) cublasLtMatmulDescSetAttribute;
  /// An operand's layout.
  decltype(&::cublasLtMatrixLayoutCreate) cublasLtMatrixLayoutCreate;
  /// Frees an operand's layout.
  decltype(&::cublasLtMatrixLayoutDestroy) cublasLtMatrixLayoutDestroy;
  /// The preferences a matmul's algorithm is chosen by.
  decltype(&::cublasLtMatmulPreferenceCreate) cublasLtMatmulPreferenceCreate;
  /// Frees the preferences.
  decltype(&::cublasLtMatmulPreferenceDestroy) cublasLtMatmulPreferenceDestroy;
  /// Sets a preference (the workspace's size).
  decltype(&::cublasLtMatmulPreferenceSetAttribute) cublasLtMatmulPreferenceSetAttribute;
  /// The algorithm cuBLASLt's heuristic chooses for a matmul.
  decltype(&::cublasLtMatmulAlgoGetHeuristic) cublasLtMatmulAlgoGetHeuristic;
  /// The matmul.
  decltype(&::cublasLtMatmul) cublasLtMatmul;
};

/// The libraries of this build's major version (libcublas.so.N, libcublasLt.so.N), opened
/// on the first call, from the toolkit the build was configured with, else wherever the
/// dynamic loader looks (LD_LIBRARY_PATH, the system's library paths); kept open for the
/// life of the process. Thread-safe. Throws std::runtime_error, with the loader's reason,
/// when a library or a function cannot be found; the next call tries again.
const CublasLibrary& cublas_library();

/// Throws std::runtime_error naming `what` and the status unless it is
/// CUBLAS_STATUS_SUCCESS. `library` names the library in the message ("cuBLAS", "cuBLASLt").
void check_cublas(cublasStatus_t status, const char* library, const char* what);

}  // namespace bigbatch::cuda
