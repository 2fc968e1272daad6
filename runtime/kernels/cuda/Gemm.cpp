//===- Gemm.cpp - cuBLAS GEMMs and matmul, forward and backward -----------===//
//
// matmul's backward chooses transposes over the forward operands, as the CPU kernel does, so
// nothing is materialised; GradWrite::Add becomes beta = 1.
//
//===----------------------------------------------------------------------===//

#include "Gemm.h"

#include "parc/Runtime/CudaCheck.h"

#include <cublas_v2.h>

#include <climits>
#include <string>

namespace parc::runtime::cuda {

namespace detail {

namespace {
int blasSize(int64_t n, const char *what) {
  if (n < 0 || n > INT_MAX)
    throwCallFailed("gemm", what, "dimension " + std::to_string(n) + " does not fit cuBLAS's int",
                    __FILE__, __LINE__);
  return static_cast<int>(n);
}

cublasOperation_t blasOp(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }
} // namespace

void gemm(Blas &blas, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
          Matrix a, Matrix b, float beta, Matrix c, int64_t batch, const char *what) {
  if (m == 0 || n == 0 || batch == 0)
    return;
  int rows = blasSize(m, what), cols = blasSize(n, what), inner = blasSize(k, what);
  int lda = blasSize(a.ld, what), ldb = blasSize(b.ld, what), ldc = blasSize(c.ld, what);
  // Column-major c^T[n,m] = op(b)^T[n,k] op(a)^T[k,m].
  if (batch == 1) {
    PARC_CUDA_CHECK(cublasGemmEx(blas.handle(), blasOp(transB), blasOp(transA), cols, rows, inner,
                                 &alpha, b.data, b.type, ldb, a.data, a.type, lda, &beta,
                                 const_cast<void *>(c.data), c.type, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
                    what);
    return;
  }
  PARC_CUDA_CHECK(cublasGemmStridedBatchedEx(
                      blas.handle(), blasOp(transB), blasOp(transA), cols, rows, inner, &alpha,
                      b.data, b.type, ldb, b.batchStride, a.data, a.type, lda, a.batchStride, &beta,
                      const_cast<void *>(c.data), c.type, ldc, c.batchStride, blasSize(batch, what),
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  what);
}

} // namespace detail

using detail::gemm;
using detail::matrix;

template <typename T>
void matmulForward(Blas &blas, T *c, const T *a, const T *b, int64_t m, int64_t n, int64_t k,
                   bool transA, bool transB) {
  // c = op(a) op(b)
  int64_t lda = transA ? m : k, ldb = transB ? k : n;
  gemm(blas, transA, transB, m, n, k, 1.0f, matrix(a, lda), matrix(b, ldb), 0.0f, matrix(c, n), 1,
       "matmulForward");
}

template <typename T>
void matmulBackward(Blas &blas, T *da, T *db, const T *a, const T *b, const T *dc, int64_t m,
                    int64_t n, int64_t k, bool transA, bool transB, GradWrite daWrite,
                    GradWrite dbWrite) {
  int64_t lda = transA ? m : k, ldb = transB ? k : n;
  if (da) {
    float beta = daWrite == GradWrite::Add ? 1.0f : 0.0f;
    if (!transA) // da[m,k] = dc op(b)^T
      gemm(blas, false, !transB, m, k, n, 1.0f, matrix(dc, n), matrix(b, ldb), beta, matrix(da, k),
           1, "matmulBackward (da)");
    else // da[k,m] = op(b) dc^T
      gemm(blas, transB, true, k, m, n, 1.0f, matrix(b, ldb), matrix(dc, n), beta, matrix(da, m), 1,
           "matmulBackward (da)");
  }
  if (db) {
    float beta = dbWrite == GradWrite::Add ? 1.0f : 0.0f;
    if (!transB) // db[k,n] = op(a)^T dc
      gemm(blas, !transA, false, k, n, m, 1.0f, matrix(a, lda), matrix(dc, n), beta, matrix(db, n),
           1, "matmulBackward (db)");
    else // db[n,k] = dc^T op(a)
      gemm(blas, true, transA, n, k, m, 1.0f, matrix(dc, n), matrix(a, lda), beta, matrix(db, k), 1,
           "matmulBackward (db)");
  }
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void matmulForward(Blas &, T *, const T *, const T *, int64_t, int64_t, int64_t, bool,  \
                              bool);                                                               \
  template void matmulBackward(Blas &, T *, T *, const T *, const T *, const T *, int64_t,         \
                               int64_t, int64_t, bool, bool, GradWrite, GradWrite);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(__nv_bfloat16)
PARC_INSTANTIATE(__half)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cuda
