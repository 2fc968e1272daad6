//===- Norm.cpp - layernorm and rmsnorm over the last dim -----------------===//
//
// The plan's backward ops get x, not the forward's statistics, so the backward
// recomputes mean and rstd per row (one extra pass over the row, cheaper than a
// saved buffer's traffic on a CPU). Row statistics accumulate in double
// whatever T is, in fixed lanes (rowSum). Rows run on the kernel threads; the
// weight and bias gradients are sums over row blocks (Rows.h), the same bits
// for any number of threads.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Rows.h"
#include "VecMath.h"

#include <cmath>

namespace parc::runtime::cpu {

namespace {
// A row's sums in double, in 8 fixed lanes (VecMath.h's laneSum).
template <typename Term>
[[gnu::always_inline]] inline double rowSum(int64_t dim, const Term &term) {
  return detail::laneSum<double, 8>(dim, term);
}

struct RowStats {
  double mean, rstd;
};

// mean and 1 / sqrt(biased variance + eps) of one row whose mean is known
template <typename T>
[[gnu::always_inline]] inline RowStats statsAbout(const T *x, int64_t dim, double mean,
                                                  double eps) {
  double var = rowSum(dim, [&](int64_t i) { return (x[i] - mean) * (x[i] - mean); });
  return {mean, 1.0 / std::sqrt(var / dim + eps)};
}

template <typename T>
[[gnu::always_inline]] inline RowStats layerNormStats(const T *x, int64_t dim, double eps) {
  return statsAbout(x, dim, rowSum(dim, [&](int64_t i) { return double(x[i]); }) / dim, eps);
}

// 1 / sqrt(mean(x^2) + eps) of one row
template <typename T>
[[gnu::always_inline]] inline double rmsNormRrms(const T *x, int64_t dim, double eps) {
  double sumSq = rowSum(dim, [&](int64_t i) { return double(x[i]) * x[i]; });
  return 1.0 / std::sqrt(sumSq / dim + eps);
}

// Rows [first, last) of each kernel, one function per kernel and type so that
// the float ones get their AVX-512 and AVX2 clones (clang clones no templates).
template <typename T>
[[gnu::always_inline]] inline void layerNormRows(T *y, const T *x, const T *weight, const T *bias,
                                                 int64_t first, int64_t last, int64_t dim,
                                                 double eps) {
  for (int64_t r = first; r < last; ++r) {
    const T *xr = x + r * dim;
    T *yr = y + r * dim;
    RowStats stats = layerNormStats(xr, dim, eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i)
      yr[i] = T((xr[i] - stats.mean) * stats.rstd * weight[i] + bias[i]);
  }
}

template <typename T>
[[gnu::always_inline]] inline void
residualLayerNormRows(T *sum, T *y, const T *a, const T *b, const T *weight, const T *bias,
                      int64_t first, int64_t last, int64_t dim, double eps) {
  for (int64_t r = first; r < last; ++r) {
    T *sr = sum + r * dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i)
      sr[i] = a[r * dim + i] + b[r * dim + i];
    layerNormRows(y + r * dim, sr, weight, bias, 0, 1, dim, eps);
  }
}

template <typename T>
[[gnu::always_inline]] inline void
layerNormBackwardRows(T *dx, T *part, const T *x, const T *weight, const T *dy, int64_t first,
                      int64_t last, int64_t dim, double eps) {
  for (int64_t r = first; r < last; ++r) {
    const T *xr = x + r * dim, *dyr = dy + r * dim;
    auto g = [&](int64_t i) { return double(dyr[i]) * weight[i]; };
    // sum(g) needs no statistics, so it shares the pass that sums x for the mean.
    auto [xSum, gSum] = detail::laneSums<double, 8>(
        dim, [&](int64_t i) { return double(xr[i]); }, g);
    double gMean = gSum / dim;
    RowStats stats = statsAbout(xr, dim, xSum / dim, eps);
    auto xhat = [&](int64_t i) { return (xr[i] - stats.mean) * stats.rstd; };
    double gxhatMean = rowSum(dim, [&](int64_t i) { return g(i) * xhat(i); }) / dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) {
      part[i] += T(dyr[i] * xhat(i));
      part[dim + i] += dyr[i];
      dx[r * dim + i] = T(stats.rstd * (g(i) - gMean - xhat(i) * gxhatMean));
    }
  }
}

template <typename T>
[[gnu::always_inline]] inline void rmsNormRows(T *y, const T *x, const T *weight, int64_t first,
                                               int64_t last, int64_t dim, double eps) {
  for (int64_t r = first; r < last; ++r) {
    const T *xr = x + r * dim;
    T *yr = y + r * dim;
    double rrms = rmsNormRrms(xr, dim, eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i)
      yr[i] = T(xr[i] * rrms * weight[i]);
  }
}

template <typename T>
[[gnu::always_inline]] inline void residualRmsNormRows(T *sum, T *y, const T *a, const T *b,
                                                       const T *weight, int64_t first, int64_t last,
                                                       int64_t dim, double eps) {
  for (int64_t r = first; r < last; ++r) {
    T *sr = sum + r * dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i)
      sr[i] = a[r * dim + i] + b[r * dim + i];
    rmsNormRows(y + r * dim, sr, weight, 0, 1, dim, eps);
  }
}

template <typename T>
[[gnu::always_inline]] inline void rmsNormBackwardRows(T *dx, T *part, const T *x, const T *weight,
                                                       const T *dy, int64_t first, int64_t last,
                                                       int64_t dim, double eps) {
  for (int64_t r = first; r < last; ++r) {
    const T *xr = x + r * dim, *dyr = dy + r * dim;
    double rrms = rmsNormRrms(xr, dim, eps);
    double gxhatMean =
        rowSum(dim, [&](int64_t i) { return double(dyr[i]) * weight[i] * (xr[i] * rrms); }) / dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) {
      part[i] += T(dyr[i] * (xr[i] * rrms));
      dx[r * dim + i] = T(rrms * (double(dyr[i]) * weight[i] - xr[i] * rrms * gxhatMean));
    }
  }
}

// The same functions by overload, the float ones cloned.
#define PARC_NORM_ROWS(ATTR, T)                                                                    \
  ATTR void normRows(T *y, const T *x, const T *w, const T *b, int64_t f, int64_t l, int64_t d,    \
                     double eps) {                                                                 \
    layerNormRows(y, x, w, b, f, l, d, eps);                                                       \
  }                                                                                                \
  ATTR void normRows(T *s, T *y, const T *a, const T *b2, const T *w, const T *b, int64_t f,       \
                     int64_t l, int64_t d, double eps) {                                           \
    residualLayerNormRows(s, y, a, b2, w, b, f, l, d, eps);                                        \
  }                                                                                                \
  ATTR void normBackwardRows(T *dx, T *part, const T *x, const T *w, const T *dy, int64_t f,       \
                             int64_t l, int64_t d, double eps) {                                   \
    layerNormBackwardRows(dx, part, x, w, dy, f, l, d, eps);                                       \
  }                                                                                                \
  ATTR void rmsRows(T *y, const T *x, const T *w, int64_t f, int64_t l, int64_t d, double eps) {   \
    rmsNormRows(y, x, w, f, l, d, eps);                                                            \
  }                                                                                                \
  ATTR void rmsRows(T *s, T *y, const T *a, const T *b, const T *w, int64_t f, int64_t l,          \
                    int64_t d, double eps) {                                                       \
    residualRmsNormRows(s, y, a, b, w, f, l, d, eps);                                              \
  }                                                                                                \
  ATTR void rmsBackwardRows(T *dx, T *part, const T *x, const T *w, const T *dy, int64_t f,        \
                            int64_t l, int64_t d, double eps) {                                    \
    rmsNormBackwardRows(dx, part, x, w, dy, f, l, d, eps);                                         \
  }
PARC_NORM_ROWS(PARC_VECTOR_CLONES, float)
PARC_NORM_ROWS(, double)
#undef PARC_NORM_ROWS
} // namespace

template <typename T>
void layerNormForward(T *y, const T *x, const T *weight, const T *bias, int64_t rows, int64_t dim,
                      double eps) {
  // y = (x - mean) * rstd * weight + bias
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    normRows(y, x, weight, bias, first, last, dim, eps);
  });
}

template <typename T>
void residualLayerNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, const T *bias,
                              int64_t rows, int64_t dim, double eps) {
  // sum = a + b; y = layernorm(sum), each row normalised while its sum is in
  // cache
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    normRows(sum, y, a, b, weight, bias, first, last, dim, eps);
  });
}

template <typename T>
void layerNormBackward(T *dx, T *dweight, T *dbias, const T *x, const T *weight, const T *dy,
                       int64_t rows, int64_t dim, double eps) {
  // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy weight; dweight += dy
  // xhat; dbias += dy
  const T *sums =
      detail::sumOverRowBlocks<T>(rows, 2 * dim, [&](int64_t first, int64_t last, T *part) {
        normBackwardRows(dx, part, x, weight, dy, first, last, dim, eps);
      });
  for (int64_t i = 0; i < dim; ++i) {
    dweight[i] += sums[i];
    dbias[i] += sums[dim + i];
  }
}

template <typename T>
void rmsNormForward(T *y, const T *x, const T *weight, int64_t rows, int64_t dim, double eps) {
  // y = x * rrms * weight
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    rmsRows(y, x, weight, first, last, dim, eps);
  });
}

template <typename T>
void residualRmsNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, int64_t rows,
                            int64_t dim, double eps) {
  // sum = a + b; y = rmsnorm(sum)
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    rmsRows(sum, y, a, b, weight, first, last, dim, eps);
  });
}

template <typename T>
void rmsNormBackward(T *dx, T *dweight, const T *x, const T *weight, const T *dy, int64_t rows,
                     int64_t dim, double eps) {
  // dx = rrms (g - xhat mean(g xhat)), g = dy weight; dweight += dy xhat
  const T *sums = detail::sumOverRowBlocks<T>(rows, dim, [&](int64_t first, int64_t last, T *part) {
    rmsBackwardRows(dx, part, x, weight, dy, first, last, dim, eps);
  });
  for (int64_t i = 0; i < dim; ++i)
    dweight[i] += sums[i];
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void layerNormForward(T *, const T *, const T *, const T *, int64_t, int64_t, double);  \
  template void layerNormBackward(T *, T *, T *, const T *, const T *, const T *, int64_t,         \
                                  int64_t, double);                                                \
  template void rmsNormForward(T *, const T *, const T *, int64_t, int64_t, double);               \
  template void residualLayerNormForward(T *, T *, const T *, const T *, const T *, const T *,     \
                                         int64_t, int64_t, double);                                \
  template void residualRmsNormForward(T *, T *, const T *, const T *, const T *, int64_t,         \
                                       int64_t, double);                                           \
  template void rmsNormBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t,       \
                                double);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
