// cublas_library.cu: opens cuBLAS and cuBLASLt on first use (see cublas_library.cuh).
#include "kernels/cublas_library.cuh"

#include <dlfcn.h>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace bigbatch::cuda {
namespace {

// The cast compiles only if one of the header's cublasGemmEx has exactly the table's type
// (decltype does not evaluate it: nothing here refers to the library's symbol).
using GemmEx = decltype(CublasLibrary::cublasGemmEx);
static_assert(std::is_same_v<decltype(static_cast<GemmEx>(&::cublasGemmEx)), GemmEx>);

/// Opens the library file `name` (a soname such as libcublas.so.13): first in the folder of
/// the toolkit this build was configured with, then by name alone, where the dynamic loader
/// looks. Throws with both reasons when neither opens.
void* open_library(const std::string& name) {
  const std::string beside_toolkit = std::string(BIGBATCH_CUDA_LIBRARY_DIR) + "/" + name;
  if (void* handle = dlopen(beside_toolkit.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  const std::string first_reason = dlerror();
  if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  throw std::runtime_error("cannot open " + name + ", which the CUDA GEMMs need: " +
                           first_reason + "; and by name: " + dlerror());
}

/// Points `function` at the symbol `name` of the open library `handle`.
template <class Function>
void look_up(void* handle, const char* library, const char* name, Function& function) {
  dlerror();  // clears an earlier error, so that the one read below is this lookup's
  function = reinterpret_cast<Function>(dlsym(handle, name));
  if (function == nullptr) {
    const char* reason = dlerror();
    throw std::runtime_error(std::string(library) + " has no function " + name +
                             (reason != nullptr ? std::string(": ") + reason : std::string()));
  }
}

/// Each function of CublasLibrary, looked up by its own name in its library.
#define BIGBATCH_LOOK_UP(handle, library, function) \
  look_up(handle, library, #function, loaded.function)

CublasLibrary open_cublas() {
  const std::string major = std::to_string(CUBLAS_VER_MAJOR);
  // cuBLASLt first: cuBLAS needs it, and an error then names the library that is missing.
  void* const lt = open_library("libcublasLt.so." + major);
  void* const blas = open_library("libcublas.so." + major);
  CublasLibrary loaded{};
  BIGBATCH_LOOK_UP(blas, "cuBLAS", cublasCreate_v2);
  BIGBATCH_LOOK_UP(blas, "cuBLAS", cublasSetMathMode);
  BIGBATCH_LOOK_UP(blas, "cuBLAS", cublasGemmEx);
  BIGBATCH_LOOK_UP(blas, "cuBLAS", cublasGetStatusName);
  BIGBATCH_LOOK_UP(blas, "cuBLAS", cublasGetStatusString);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtCreate);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatmulDescCreate);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatmulDescDestroy);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatmulDescSetAttribute);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatrixLayoutCreate);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatrixLayoutDestroy);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatmulPreferenceCreate);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatmulPreferenceDestroy);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatmulPreferenceSetAttribute);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatmulAlgoGetHeuristic);
  BIGBATCH_LOOK_UP(lt, "cuBLASLt", cublasLtMatmul);
  return loaded;  // the handles stay open: the functions are used until the process ends
}

#undef BIGBATCH_LOOK_UP

}  // namespace

const CublasLibrary& cublas_library() {
  // A static initialised once, under the lock C++ puts around it; a throw leaves it
  // uninitialised, and the next call tries again.
  static const CublasLibrary library = open_cublas();
  return library;
}

void check_cublas(cublasStatus_t status, const char* library, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const CublasLibrary& blas = cublas_library();
  throw std::runtime_error(std::string(library) + " error in " + what + ": " +
                           blas.cublasGetStatusName(status) + " (" +
                           blas.cublasGetStatusString(status) + ")");
}

}  // namespace bigbatch::cuda
