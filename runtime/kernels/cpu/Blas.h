//===- Blas.h - Row-major GEMM over OpenBLAS for float and double ---------===//
//
// Private to the CPU kernels: one overload per element type so that templated kernels call
// `gemm` and the right cblas routine is chosen at compile time.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CPU_BLAS_H
#define PARC_RUNTIME_KERNELS_CPU_BLAS_H

#include <cblas.h>

#include <cassert>
#include <climits>
#include <cstdint>

namespace parc::runtime::cpu::detail {

// OpenBLAS is built with 32-bit indices; a single GEMM dimension beyond that is far outside
// what a CPU run of parrun multiplies.
inline blasint blasSize(int64_t n) {
  assert(n >= 0 && n <= INT_MAX && "GEMM dimension does not fit OpenBLAS's 32-bit index");
  return static_cast<blasint>(n);
}

inline CBLAS_TRANSPOSE blasTrans(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

/// c[m,n] = alpha op(a)[m,k] op(b)[k,n] + beta c, row-major with leading dimensions.
inline void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, blasTrans(transA), blasTrans(transB), blasSize(m), blasSize(n),
              blasSize(k), alpha, a, blasSize(lda), b, blasSize(ldb), beta, c, blasSize(ldc));
}

inline void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, double alpha,
                 const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *c,
                 int64_t ldc) {
  cblas_dgemm(CblasRowMajor, blasTrans(transA), blasTrans(transB), blasSize(m), blasSize(n),
              blasSize(k), alpha, a, blasSize(lda), b, blasSize(ldb), beta, c, blasSize(ldc));
}

} // namespace parc::runtime::cpu::detail

#endif
