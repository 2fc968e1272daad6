//===- CudaCheck.h - Checked CUDA and cuBLAS calls, errors that say where -===//
//
// Every CUDA and cuBLAS call of the CUDA backend goes through PARC_CUDA_CHECK(call, context).
// A failure throws CudaError whose message names the call, the caller's context (the kernel
// and the buffer, say) and what the thread is doing, which the executor sets with an
// ErrorScope around each op: "attention_bwd on rank 3". Kernel launches are checked with
// cudaGetLastError() right after the launch; faults inside a kernel surface at the next
// synchronising call, which is checked the same way.
//
// NCCL results are checked by the same macro in NCCLCommunicator.cpp, which adds the overload
// so that this header stays free of nccl.h.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CUDACHECK_H
#define PARC_RUNTIME_CUDACHECK_H

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace parc::runtime::cuda {

class CudaError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Names what the calling thread does until the scope ends ("layernorm_bwd on rank 5");
/// scopes nest, the innermost one is reported.
class ErrorScope {
public:
  explicit ErrorScope(std::string what);
  ~ErrorScope();
  ErrorScope(const ErrorScope &) = delete;
  ErrorScope &operator=(const ErrorScope &) = delete;

  /// The innermost scope of the calling thread, empty outside any.
  static const std::string &current();

private:
  std::string previous;
};

inline bool succeeded(cudaError_t status) { return status == cudaSuccess; }
inline bool succeeded(cublasStatus_t status) { return status == CUBLAS_STATUS_SUCCESS; }
/// "cudaErrorMemoryAllocation: out of memory".
std::string errorText(cudaError_t status);
std::string errorText(cublasStatus_t status);

/// Throws CudaError: "<call> failed in <context> (<scope>): <error> [<file>:<line>]".
[[noreturn]] void throwCallFailed(const char *call, const std::string &context,
                                  const std::string &error, const char *file, int line);

/// `context` is a const char * or a std::string, only turned into a message on failure.
template <typename Status, typename Context>
inline void check(Status status, const char *call, const Context &context, const char *file,
                  int line) {
  if (!succeeded(status))
    throwCallFailed(call, context, errorText(status), file, line);
}

} // namespace parc::runtime::cuda

#define PARC_CUDA_CHECK(call, context)                                                             \
  ::parc::runtime::cuda::check((call), #call, (context), __FILE__, __LINE__)

#endif // PARC_RUNTIME_CUDACHECK_H
