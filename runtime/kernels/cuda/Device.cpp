//===- Device.cpp - Device detection, error reporting, the cuBLAS handle --===//

#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaKernels.h"

#include <cublas_v2.h>

namespace parc::runtime::cuda {

namespace {
thread_local std::string currentScope;

/// cuBLAS's recommended workspace on Hopper (4 MiB would do before it).
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;
} // namespace

ErrorScope::ErrorScope(std::string what) : previous(std::move(currentScope)) {
  currentScope = std::move(what);
}

ErrorScope::~ErrorScope() { currentScope = std::move(previous); }

const std::string &ErrorScope::current() { return currentScope; }

std::string errorText(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

std::string errorText(cublasStatus_t status) {
  return std::string(cublasGetStatusName(status)) + ": " + cublasGetStatusString(status);
}

void throwCallFailed(const char *call, const std::string &context, const std::string &error,
                     const char *file, int line) {
  std::string where = currentScope.empty() ? "" : " (" + currentScope + ")";
  std::string base = file;
  base = base.substr(base.find_last_of('/') + 1);
  throw CudaError(std::string(call) + " failed in " + context + where + ": " + error + " [" + base +
                  ":" + std::to_string(line) + "]");
}

bool cudaDeviceAvailable(std::string *why) {
  auto unavailable = [&](std::string reason) {
    if (why)
      *why = std::move(reason);
    return false;
  };
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0))
    return unavailable("no CUDA device");
  if (status != cudaSuccess) {
    // Without libcuda the runtime reports an "insufficient" driver; say what is missing.
    int driver = 0;
    if (cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0)
      return unavailable("no CUDA device: no CUDA driver is installed");
    return unavailable("no CUDA device: " + errorText(status));
  }
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return unavailable("cannot query CUDA device " + std::to_string(device) + ": " +
                       errorText(cudaGetLastError()));
  if (major < 8)
    return unavailable("CUDA device " + std::to_string(device) + " has compute capability " +
                       std::to_string(major) + "." + std::to_string(minor) +
                       "; the CUDA kernels need 8.0 (Ampere) or newer");
  return true;
}

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  cublasHandle_t handle;
  PARC_CUDA_CHECK(cublasCreate(&handle), "creating the cuBLAS handle");
  handle_ = handle;
  try {
    PARC_CUDA_CHECK(cublasSetStream(handle, stream), "binding cuBLAS to the rank's stream");
    // After cublasSetStream, which resets the workspace to cuBLAS's shared pool.
    PARC_CUDA_CHECK(cudaMalloc(&workspace, kBlasWorkspaceBytes), "the cuBLAS workspace");
    PARC_CUDA_CHECK(cublasSetWorkspace(handle, workspace, kBlasWorkspaceBytes),
                    "the cuBLAS workspace");
    // fp32 accumulation all the way: no split-K partial sums rounded to bf16/fp16.
    PARC_CUDA_CHECK(
        cublasSetMathMode(
            handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
        "the cuBLAS math mode");
  } catch (...) {
    cublasDestroy(handle);
    cudaFree(workspace);
    throw;
  }
}

Blas::~Blas() {
  // Destruction must not throw; a failure here means the context is already gone.
  cublasDestroy(handle_);
  cudaFree(workspace);
}

} // namespace parc::runtime::cuda
