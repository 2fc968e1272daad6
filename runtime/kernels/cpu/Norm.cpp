//===- Norm.cpp - layernorm and rmsnorm over the last dim -----------------===//
//
// The plan's backward ops get x, not the forward's statistics, so the backward
// recomputes mean and rstd per row (cheaper than a saved buffer's traffic on a
// CPU). Row statistics accumulate in double whatever T is, in fixed lanes
// (rowLaneSums); a float row takes them in one pass and is normalised in float,
// about twice as fast as in double (ns an element at dim 1024 on one core:
// layernorm's backward 0.64 against 1.33, forward 0.30 against 0.54; rmsnorm's
// 0.44 against 0.91 and 0.19 against 0.33). Rows run on the kernel threads;
// the weight and bias gradients are sums over row blocks (Rows.h), the same
// bits for any number of threads.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Rows.h"
#include "VecMath.h"

#include <array>
#include <cmath>
#include <type_traits>
#include <utility>

namespace parc::runtime::cpu {

namespace {
// Rows are normalised in groups of groupRows: a row's sums are chains of dependent adds
// (laneSum's lanes), and a row of a few hundred elements waits on the adder's latency; the
// rows of a group sum side by side (rowLaneSums) with each row's bits unchanged.
constexpr int64_t groupRows = 4;
template <int64_t R> using Rows = std::integral_constant<int64_t, R>;

/// Calls group(Rows<R>{}, r) for rows [first, last): groups of groupRows, then single rows.
template <typename Group>
[[gnu::always_inline]] inline void forRowGroups(int64_t first, int64_t last, const Group &group) {
  int64_t r = first;
  for (; r + groupRows <= last; r += groupRows)
    group(Rows<groupRows>{}, r);
  for (; r < last; ++r)
    group(Rows<1>{}, r);
}

// The sums of R rows in double, each in 8 fixed lanes (VecMath.h's rowLaneSums).
template <int64_t R, typename... Terms>
[[gnu::always_inline]] inline auto rowSums(int64_t dim, const Terms &...terms) {
  return detail::rowLaneSums<double, 8, R>(dim, terms...);
}

struct RowStats {
  double mean, rstd;
};

// mean and 1 / sqrt(biased variance + eps) of R rows (row r at x + r dim) whose means are known
template <int64_t R, typename T>
[[gnu::always_inline]] inline std::array<RowStats, R>
statsAbout(const T *x, int64_t dim, const std::array<double, R> &mean, double eps) {
  auto var = rowSums<R>(dim, [&](int64_t r, int64_t i) {
    return (x[r * dim + i] - mean[r]) * (x[r * dim + i] - mean[r]);
  });
  std::array<RowStats, R> stats;
  for (int64_t r = 0; r < R; ++r)
    stats[r] = {mean[r], 1.0 / std::sqrt(var[r][0] / dim + eps)};
  return stats;
}

// 1 / sqrt(mean(x^2) + eps) of R rows, and the row sums (rowSums) of x^2 and of `more`
// terms beside it, in the same pass.
template <int64_t R, typename T, typename... More>
[[gnu::always_inline]] inline auto rmsNormSums(const T *x, int64_t dim, double eps,
                                               const More &...more) {
  auto sums = rowSums<R>(
      dim, [&](int64_t r, int64_t i) { return double(x[r * dim + i]) * x[r * dim + i]; },
      more...);
  std::array<double, R> rrms;
  for (int64_t r = 0; r < R; ++r)
    rrms[r] = 1.0 / std::sqrt(sums[r][0] / dim + eps);
  return std::pair{rrms, sums};
}
template <int64_t R, typename T>
[[gnu::always_inline]] inline std::array<double, R> rmsNormRrms(const T *x, int64_t dim,
                                                                double eps) {
  return rmsNormSums<R>(x, dim, eps).first;
}

// A float row's sums in one pass, of d = x - x[0] and d^2 in double (d is exact there), and
// with `more` terms (more(r, i, d)) beside them: about x[0], the variance E[d^2] - E[d]^2
// cancels like a two-pass one's. A double row's d would round, so it keeps the two passes.
template <int64_t R, typename T, typename... More>
[[gnu::always_inline]] inline auto shiftedRowSums(const T *x, int64_t dim, const More &...more) {
  auto d = [&](int64_t r, int64_t i) { return double(x[r * dim + i]) - double(x[r * dim]); };
  return rowSums<R>(
      dim, d, [&](int64_t r, int64_t i) { return d(r, i) * d(r, i); },
      [&](int64_t r, int64_t i) { return more(r, i, d(r, i)); }...);
}

// mean and rstd of a row from shiftedRowSums's first two sums
template <typename Sums>
[[gnu::always_inline]] inline RowStats shiftedStats(const Sums &sums, double shift, int64_t dim,
                                                    double eps) {
  double dMean = sums[0] / dim;
  double var = std::max(0.0, sums[1] / dim - dMean * dMean);
  return {shift + dMean, 1.0 / std::sqrt(var + eps)};
}

template <int64_t R, typename T>
[[gnu::always_inline]] inline std::array<RowStats, R> rowStats(const T *x, int64_t dim,
                                                               double eps) {
  std::array<RowStats, R> stats;
  if constexpr (std::is_same_v<T, float>) {
    auto sums = shiftedRowSums<R>(x, dim);
    for (int64_t r = 0; r < R; ++r)
      stats[r] = shiftedStats(sums[r], x[r * dim], dim, eps);
  } else {
    auto sums = rowSums<R>(dim, [&](int64_t r, int64_t i) { return double(x[r * dim + i]); });
    std::array<double, R> mean;
    for (int64_t r = 0; r < R; ++r)
      mean[r] = sums[r][0] / dim;
    stats = statsAbout<R>(x, dim, mean, eps);
  }
  return stats;
}

/// x - mean in T: a float row subtracts the mean's float and then its remainder (x - hi is
/// exact for the x near the mean), so a row far from zero keeps the bits of its spread.
template <typename T> struct Centre {
  T hi, lo;
  explicit Centre(double mean) : hi(T(mean)), lo(T(mean - double(hi))) {}
  T of(T x) const {
    if constexpr (std::is_same_v<T, float>)
      return (x - hi) - lo;
    else
      return x - hi;
  }
};

// Rows [first, last) of each kernel, one function per kernel and type so that
// the float ones get their AVX-512 and AVX2 clones (clang clones no templates).
template <typename T>
[[gnu::always_inline]] inline void layerNormRows(T *y, const T *x, const T *weight, const T *bias,
                                                 int64_t first, int64_t last, int64_t dim,
                                                 double eps) {
  forRowGroups(first, last, [&](auto rows, int64_t r0) PARC_INLINE_LAMBDA {
    constexpr int64_t R = decltype(rows)::value;
    const T *xr = x + r0 * dim;
    T *yr = y + r0 * dim;
    std::array<RowStats, R> stats = rowStats<R>(xr, dim, eps);
    for (int64_t r = 0; r < R; ++r) {
      Centre<T> mean(stats[r].mean);
      T rstd = T(stats[r].rstd);
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i)
        yr[r * dim + i] = mean.of(xr[r * dim + i]) * rstd * weight[i] + bias[i];
    }
  });
}

// sum = a + b, then y = norm(sum) by normRows, a group of rows at a time while the sums are
// in cache.
template <typename T, typename NormRows>
[[gnu::always_inline]] inline void residualThen(T *sum, const T *a, const T *b, int64_t first,
                                                int64_t last, int64_t dim,
                                                const NormRows &normRows) {
  forRowGroups(first, last, [&](auto rows, int64_t r0) PARC_INLINE_LAMBDA {
    constexpr int64_t R = decltype(rows)::value;
#pragma omp simd
    for (int64_t i = r0 * dim; i < (r0 + R) * dim; ++i)
      sum[i] = a[i] + b[i];
    normRows(r0, r0 + R);
  });
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) of R rows whose sums of g and of g xhat are known
template <int64_t R, typename T>
[[gnu::always_inline]] inline void layerNormBackwardOut(T *dx, T *part, const T *x, const T *weight,
                                                        const T *dy, int64_t dim,
                                                        const std::array<RowStats, R> &stats,
                                                        const std::array<double, R> &gSum,
                                                        const std::array<double, R> &gxhatSum) {
  for (int64_t r = 0; r < R; ++r) {
    Centre<T> mean(stats[r].mean);
    T rstd = T(stats[r].rstd), gMean = T(gSum[r] / dim), gxhatMean = T(gxhatSum[r] / dim);
    const T *xr = x + r * dim, *dyr = dy + r * dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) {
      T xhat = mean.of(xr[i]) * rstd;
      part[i] += dyr[i] * xhat;
      part[dim + i] += dyr[i];
      dx[r * dim + i] = rstd * (dyr[i] * weight[i] - gMean - xhat * gxhatMean);
    }
  }
}

template <typename T>
[[gnu::always_inline]] inline void
layerNormBackwardRows(T *dx, T *part, const T *x, const T *weight, const T *dy, int64_t first,
                      int64_t last, int64_t dim, double eps) {
  forRowGroups(first, last, [&](auto rows, int64_t r0) PARC_INLINE_LAMBDA {
    constexpr int64_t R = decltype(rows)::value;
    const T *xr = x + r0 * dim, *dyr = dy + r0 * dim;
    auto xAt = [&](int64_t r, int64_t i) { return double(xr[r * dim + i]); };
    auto g = [&](int64_t r, int64_t i) { return double(dyr[r * dim + i]) * weight[i]; };
    std::array<RowStats, R> stats;
    std::array<double, R> gSum, gxhatSum;
    if constexpr (std::is_same_v<T, float>) {
      // One pass, as rowStats's: sum(g xhat) = rstd (sum(g d) - (mean - x[0]) sum(g)).
      auto sums = shiftedRowSums<R>(
          xr, dim, [&](int64_t r, int64_t i, double) { return g(r, i); },
          [&](int64_t r, int64_t i, double d) { return g(r, i) * d; });
      for (int64_t r = 0; r < R; ++r) {
        double shift = xr[r * dim];
        stats[r] = shiftedStats(sums[r], shift, dim, eps);
        gSum[r] = sums[r][2];
        gxhatSum[r] = stats[r].rstd * (sums[r][3] - (stats[r].mean - shift) * sums[r][2]);
      }
    } else {
      // sum(g) needs no statistics, so it shares the pass that sums x for the mean.
      auto sums = rowSums<R>(dim, xAt, g);
      std::array<double, R> mean;
      for (int64_t r = 0; r < R; ++r) {
        mean[r] = sums[r][0] / dim;
        gSum[r] = sums[r][1];
      }
      stats = statsAbout<R>(xr, dim, mean, eps);
      auto gxhat = rowSums<R>(dim, [&](int64_t r, int64_t i) {
        return g(r, i) * ((xAt(r, i) - stats[r].mean) * stats[r].rstd);
      });
      for (int64_t r = 0; r < R; ++r)
        gxhatSum[r] = gxhat[r][0];
    }
    layerNormBackwardOut<R>(dx + r0 * dim, part, xr, weight, dyr, dim, stats, gSum, gxhatSum);
  });
}

template <typename T>
[[gnu::always_inline]] inline void rmsNormRows(T *y, const T *x, const T *weight, int64_t first,
                                               int64_t last, int64_t dim, double eps) {
  forRowGroups(first, last, [&](auto rows, int64_t r0) PARC_INLINE_LAMBDA {
    constexpr int64_t R = decltype(rows)::value;
    const T *xr = x + r0 * dim;
    T *yr = y + r0 * dim;
    std::array<double, R> rrms = rmsNormRrms<R>(xr, dim, eps);
    for (int64_t r = 0; r < R; ++r) {
      T rr = T(rrms[r]);
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i)
        yr[r * dim + i] = xr[r * dim + i] * rr * weight[i];
    }
  });
}

template <typename T>
[[gnu::always_inline]] inline void rmsNormBackwardRows(T *dx, T *part, const T *x, const T *weight,
                                                       const T *dy, int64_t first, int64_t last,
                                                       int64_t dim, double eps) {
  forRowGroups(first, last, [&](auto rows, int64_t r0) PARC_INLINE_LAMBDA {
    constexpr int64_t R = decltype(rows)::value;
    const T *xr = x + r0 * dim, *dyr = dy + r0 * dim;
    auto g = [&](int64_t r, int64_t i) { return double(dyr[r * dim + i]) * weight[i]; };
    std::array<double, R> rrms, gxhatSum;
    if constexpr (std::is_same_v<T, float>) {
      // One pass: sum(g xhat) = rrms sum(g x), beside the sum of squares.
      auto [rowRrms, sums] = rmsNormSums<R>(
          xr, dim, eps, [&](int64_t r, int64_t i) { return g(r, i) * xr[r * dim + i]; });
      rrms = rowRrms;
      for (int64_t r = 0; r < R; ++r)
        gxhatSum[r] = rrms[r] * sums[r][1];
    } else {
      rrms = rmsNormRrms<R>(xr, dim, eps);
      auto gxhat = rowSums<R>(
          dim, [&](int64_t r, int64_t i) { return g(r, i) * (xr[r * dim + i] * rrms[r]); });
      for (int64_t r = 0; r < R; ++r)
        gxhatSum[r] = gxhat[r][0];
    }
    for (int64_t r = 0; r < R; ++r) {
      T rr = T(rrms[r]), gxhatMean = T(gxhatSum[r] / dim);
      const T *xRow = xr + r * dim, *dyRow = dyr + r * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) {
        T xhat = xRow[i] * rr;
        part[i] += dyRow[i] * xhat;
        dx[(r0 + r) * dim + i] = rr * (dyRow[i] * weight[i] - xhat * gxhatMean);
      }
    }
  });
}

// The same functions by overload, the float ones cloned.
#define PARC_NORM_ROWS(ATTR, T)                                                                    \
  ATTR void normRows(T *y, const T *x, const T *w, const T *b, int64_t f, int64_t l, int64_t d,    \
                     double eps) {                                                                 \
    layerNormRows(y, x, w, b, f, l, d, eps);                                                       \
  }                                                                                                \
  ATTR void normRows(T *s, T *y, const T *a, const T *b2, const T *w, const T *b, int64_t f,       \
                     int64_t l, int64_t d, double eps) {                                           \
    residualThen(s, a, b2, f, l, d, [&](int64_t g, int64_t h) PARC_INLINE_LAMBDA {                 \
      layerNormRows(y, s, w, b, g, h, d, eps);                                                     \
    });                                                                                            \
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
    residualThen(s, a, b, f, l, d, [&](int64_t g, int64_t h) PARC_INLINE_LAMBDA {                  \
      rmsNormRows(y, s, w, g, h, d, eps);                                                          \
    });                                                                                            \
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
  // sum = a + b; y = layernorm(sum), a group of rows normalised while its sums are in cache
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
