//===- Linear.cpp - matmul, bias_add and residual_add ---------------------===//
//
// Every GEMM runs on its operands in place (Blas.h cuts it into cblas calls over the threads);
// the backward of matmul reuses the forward operands by choosing the transposes instead of
// materialising op(a) or op(b). The elementwise loops are
// `#pragma omp simd`: y may be x itself (an input that dies here), element for element, which
// a vector loop allows.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Blas.h"
#include "Rows.h"
#include "VecMath.h"

#include <algorithm>

namespace parc::runtime::cpu {

using detail::gemm;

namespace {
// The elementwise loops, one function per type so that the float ones get their AVX-512 and
// AVX2 clones (VecMath.h; clang clones no templates).
template <typename T>
[[gnu::always_inline]] inline void columnSumsLoop(T *part, const T *dy, int64_t first,
                                                  int64_t last, int64_t dim) {
  for (int64_t r = first; r < last; ++r) {
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i)
      part[i] += dy[r * dim + i];
  }
}

template <typename T>
[[gnu::always_inline]] inline void sumLoop(T *y, const T *a, const T *b, int64_t begin,
                                           int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i)
    y[i] = a[i] + b[i];
}

#define PARC_ADD_LOOPS(ATTR, T)                                                                    \
  ATTR void addBiasRows(T *y, const T *x, const T *bias, int64_t f, int64_t l, int64_t d) {        \
    detail::mapBiasedRows(y, x, bias, f, l, d, [](T v) PARC_INLINE_LAMBDA { return v; });          \
  }                                                                                                \
  ATTR void addColumnSums(T *part, const T *dy, int64_t f, int64_t l, int64_t d) {                 \
    columnSumsLoop(part, dy, f, l, d);                                                             \
  }                                                                                                \
  ATTR void addElements(T *y, const T *a, const T *b, int64_t begin, int64_t end) {                \
    sumLoop(y, a, b, begin, end);                                                                  \
  }
PARC_ADD_LOOPS(PARC_VECTOR_CLONES, float)
PARC_ADD_LOOPS(, double)
#undef PARC_ADD_LOOPS
} // namespace

template <typename T>
void matmulForward(T *c, const T *a, const T *b, int64_t m, int64_t n, int64_t k, bool transA,
                   bool transB) {
  // c = op(a) op(b)
  int64_t lda = transA ? m : k, ldb = transB ? k : n;
  gemm(transA, transB, m, n, k, T(1), a, lda, b, ldb, T(0), c, n);
}

template <typename T>
void matmulBackward(T *da, T *db, const T *a, const T *b, const T *dc, int64_t m, int64_t n,
                    int64_t k, bool transA, bool transB, GradWrite daWrite, GradWrite dbWrite) {
  int64_t lda = transA ? m : k, ldb = transB ? k : n;
  if (da) {
    T beta = daWrite == GradWrite::Add ? T(1) : T(0);
    if (!transA) // da[m,k] = dc op(b)^T
      gemm(false, !transB, m, k, n, T(1), dc, n, b, ldb, beta, da, k);
    else // da[k,m] = op(b) dc^T
      gemm(transB, true, k, m, n, T(1), b, ldb, dc, n, beta, da, m);
  }
  if (db) {
    T beta = dbWrite == GradWrite::Add ? T(1) : T(0);
    if (!transB) // db[k,n] = op(a)^T dc
      gemm(!transA, false, k, n, m, T(1), a, lda, dc, n, beta, db, n);
    else // db[n,k] = dc^T op(a)
      gemm(true, transA, n, k, m, T(1), dc, n, a, lda, beta, db, k);
  }
}

template <typename T>
void biasAddForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim) {
  // y[r,:] = x[r,:] + bias
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    addBiasRows(y, x, bias, first, last, dim);
  });
}

template <typename T>
void biasAddBackward(T *dx, T *dbias, const T *dy, int64_t rows, int64_t dim) {
  // dx = dy; dbias += sum_r dy[r,:]; dx may be dy itself
  const T *sums = detail::sumOverRowBlocks<T>(rows, dim, [&](int64_t first, int64_t last, T *part) {
    if (dx != dy)
      std::copy(dy + first * dim, dy + last * dim, dx + first * dim);
    addColumnSums(part, dy, first, last, dim);
  });
  for (int64_t i = 0; i < dim; ++i)
    dbias[i] += sums[i];
}

template <typename T> void residualAddForward(T *y, const T *a, const T *b, int64_t n) {
  // y = a + b
  detail::forElements(n, [&](int64_t begin, int64_t end) { addElements(y, a, b, begin, end); });
}

template <typename T> void residualAddBackward(T *da, T *db, const T *dy, int64_t n) {
  // da = db = dy; either may be dy itself
  detail::forElements(n, [&](int64_t begin, int64_t end) {
    if (da != dy)
      std::copy(dy + begin, dy + end, da + begin);
    if (db != dy)
      std::copy(dy + begin, dy + end, db + begin);
  });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void matmulForward(T *, const T *, const T *, int64_t, int64_t, int64_t, bool, bool);   \
  template void matmulBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t,        \
                               int64_t, bool, bool, GradWrite, GradWrite);                         \
  template void biasAddForward(T *, const T *, const T *, int64_t, int64_t);                       \
  template void biasAddBackward(T *, T *, const T *, int64_t, int64_t);                            \
  template void residualAddForward(T *, const T *, const T *, int64_t);                            \
  template void residualAddBackward(T *, T *, const T *, int64_t);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
