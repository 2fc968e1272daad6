//===- Blas.h - Row-major GEMM over OpenBLAS for float and double ---------===//
//
// Private to the CPU kernels: one overload per element type so that templated kernels call
// `gemm` and the right cblas routine is chosen at compile time. OpenBLAS runs single-threaded
// (Parallel.h): `gemm` cuts C into blocks of rows (or of columns, when it is wider than tall)
// and multiplies them on the kernel threads, each block one cblas call on the operands in place.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CPU_BLAS_H
#define PARC_RUNTIME_KERNELS_CPU_BLAS_H

#include "Parallel.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace parc::runtime::cpu::detail {

// OpenBLAS is built with 32-bit indices; a single GEMM dimension beyond that is far outside
// what a CPU run of parrun multiplies, but it must fail, not wrap (the rank reports it).
inline blasint blasSize(int64_t n) {
  if (n < 0 || n > INT_MAX)
    throw std::length_error("GEMM dimension " + std::to_string(n) +
                            " does not fit OpenBLAS's 32-bit index");
  return static_cast<blasint>(n);
}

inline CBLAS_TRANSPOSE blasTrans(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

/// c[m,n] = alpha op(a)[m,k] op(b)[k,n] + beta c, row-major with leading dimensions, on this
/// thread.
inline void gemmSerial(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, blasTrans(transA), blasTrans(transB), blasSize(m), blasSize(n),
              blasSize(k), alpha, a, blasSize(lda), b, blasSize(ldb), beta, c, blasSize(ldc));
}

inline void gemmSerial(bool transA, bool transB, int64_t m, int64_t n, int64_t k, double alpha,
                       const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                       double *c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, blasTrans(transA), blasTrans(transB), blasSize(m), blasSize(n),
              blasSize(k), alpha, a, blasSize(lda), b, blasSize(ldb), beta, c, blasSize(ldc));
}

/// gemmSerial, on the kernel threads: rows of C (columns when n > m) in blocks that are whole
/// multiples of OpenBLAS's register tile, so that no block runs its edge kernels needlessly.
template <typename T>
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, T alpha, const T *a,
          int64_t lda, const T *b, int64_t ldb, T beta, T *c, int64_t ldc) {
  // Checked whole, before a block of them could fit where the product does not.
  for (int64_t size : {m, n, k, lda, ldb, ldc})
    blasSize(size);
  // About 15 us of one core's work per block; smaller products are not worth a second thread.
  constexpr int64_t tile = 16, minBlockFlops = int64_t(1) << 20;
  bool byRows = m >= n;
  int64_t length = byRows ? m : n, width = byRows ? n : m;
  int64_t units = (length + tile - 1) / tile;
  int64_t grain = std::max<int64_t>(1, minBlockFlops / std::max<int64_t>(1, 2 * tile * width * k));
  // One block a thread: OpenBLAS packs the shared operand again for every call.
  parallelFor(
      units, grain,
      [&](int64_t begin, int64_t end) {
    int64_t first = begin * tile, count = std::min(end * tile, length) - first;
    if (byRows)
      gemmSerial(transA, transB, count, n, k, alpha, transA ? a + first : a + first * lda, lda, b,
                 ldb, beta, c + first * ldc, ldc);
    else
      gemmSerial(transA, transB, m, count, k, alpha, a, lda, transB ? b + first * ldb : b + first,
                 ldb, beta, c + first, ldc);
      },
      1);
}

} // namespace parc::runtime::cpu::detail

#endif
