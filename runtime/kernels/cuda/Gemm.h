//===- Gemm.h - Row-major GEMMs over cuBLAS, any storage type, fp32 compute -===//
//
// Private to the CUDA kernels. cuBLAS is column-major; a row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, so every call swaps the operands instead of moving data.
// The types of A, B and C are passed separately because attention multiplies bf16 operands
// into fp32 scores.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CUDA_GEMM_H
#define PARC_RUNTIME_KERNELS_CUDA_GEMM_H

#include "parc/Runtime/CudaKernels.h"

#include <library_types.h>

#include <cstdint>

namespace parc::runtime::cuda::detail {

template <typename T> struct DataType;
template <> struct DataType<float> { static constexpr cudaDataType_t value = CUDA_R_32F; };
template <> struct DataType<__nv_bfloat16> { static constexpr cudaDataType_t value = CUDA_R_16BF; };
template <> struct DataType<__half> { static constexpr cudaDataType_t value = CUDA_R_16F; };

/// One operand of a (batched) GEMM: its data, type, leading dimension and the distance
/// between consecutive matrices of the batch.
struct Matrix {
  const void *data;
  cudaDataType_t type;
  int64_t ld;
  int64_t batchStride = 0;
};

template <typename T> Matrix matrix(const T *data, int64_t ld, int64_t batchStride = 0) {
  return {data, DataType<T>::value, ld, batchStride};
}

/// c = alpha op(a) op(b) + beta c for `batch` matrices, row-major, c[m,n], op(a)[m,k],
/// op(b)[k,n]. `what` names the caller in error messages.
void gemm(Blas &blas, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
          Matrix a, Matrix b, float beta, Matrix c, int64_t batch, const char *what);

} // namespace parc::runtime::cuda::detail

#endif
