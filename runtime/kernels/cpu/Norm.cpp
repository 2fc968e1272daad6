//===- Norm.cpp - layernorm and rmsnorm over the last dim -----------------===//
//
// The plan's backward ops get x, not the forward's statistics, so the backward recomputes
// mean and rstd per row (one extra pass over the row, cheaper than a saved buffer's traffic on
// a CPU). Row statistics accumulate in double whatever T is. Rows run on the kernel threads;
// the weight and bias gradients are sums over row blocks (Rows.h), the same bits for any
// number of threads.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Rows.h"

#include <cmath>

namespace parc::runtime::cpu {

namespace {
struct RowStats {
  double mean, rstd;
};

// mean and 1 / sqrt(biased variance + eps) of one row
template <typename T> RowStats layerNormStats(const T *x, int64_t dim, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < dim; ++i)
    sum += x[i];
  double mean = sum / dim, var = 0;
  for (int64_t i = 0; i < dim; ++i)
    var += (x[i] - mean) * (x[i] - mean);
  return {mean, 1.0 / std::sqrt(var / dim + eps)};
}

// 1 / sqrt(mean(x^2) + eps) of one row
template <typename T> double rmsNormRrms(const T *x, int64_t dim, double eps) {
  double sumSq = 0;
  for (int64_t i = 0; i < dim; ++i)
    sumSq += double(x[i]) * x[i];
  return 1.0 / std::sqrt(sumSq / dim + eps);
}

template <typename T>
void layerNormRow(T *y, const T *x, const T *weight, const T *bias, int64_t dim, double eps) {
  RowStats stats = layerNormStats(x, dim, eps);
  for (int64_t i = 0; i < dim; ++i)
    y[i] = T((x[i] - stats.mean) * stats.rstd * weight[i] + bias[i]);
}

template <typename T> void rmsNormRow(T *y, const T *x, const T *weight, int64_t dim, double eps) {
  double rrms = rmsNormRrms(x, dim, eps);
  for (int64_t i = 0; i < dim; ++i)
    y[i] = T(x[i] * rrms * weight[i]);
}
} // namespace

template <typename T>
void layerNormForward(T *y, const T *x, const T *weight, const T *bias, int64_t rows, int64_t dim,
                      double eps) {
  // y = (x - mean) * rstd * weight + bias
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      layerNormRow(y + r * dim, x + r * dim, weight, bias, dim, eps);
  });
}

template <typename T>
void residualLayerNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, const T *bias,
                              int64_t rows, int64_t dim, double eps) {
  // sum = a + b; y = layernorm(sum), each row normalised while its sum is in cache
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      T *sr = sum + r * dim;
      for (int64_t i = 0; i < dim; ++i)
        sr[i] = a[r * dim + i] + b[r * dim + i];
      layerNormRow(y + r * dim, sr, weight, bias, dim, eps);
    }
  });
}

template <typename T>
void layerNormBackward(T *dx, T *dweight, T *dbias, const T *x, const T *weight, const T *dy,
                       int64_t rows, int64_t dim, double eps) {
  // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy weight; dweight += dy xhat; dbias += dy
  auto rowsOfBlock = [&](int64_t first, int64_t last, T *part) {
    for (int64_t r = first; r < last; ++r) {
      const T *xr = x + r * dim, *dyr = dy + r * dim;
      RowStats stats = layerNormStats(xr, dim, eps);
      double gMean = 0, gxhatMean = 0;
      for (int64_t i = 0; i < dim; ++i) {
        double xhat = (xr[i] - stats.mean) * stats.rstd, g = double(dyr[i]) * weight[i];
        gMean += g;
        gxhatMean += g * xhat;
        part[i] += T(dyr[i] * xhat);
        part[dim + i] += dyr[i];
      }
      gMean /= dim;
      gxhatMean /= dim;
      for (int64_t i = 0; i < dim; ++i) {
        double xhat = (xr[i] - stats.mean) * stats.rstd, g = double(dyr[i]) * weight[i];
        dx[r * dim + i] = T(stats.rstd * (g - gMean - xhat * gxhatMean));
      }
    }
  };
  const T *sums = detail::sumOverRowBlocks<T>(rows, 2 * dim, rowsOfBlock);
  for (int64_t i = 0; i < dim; ++i) {
    dweight[i] += sums[i];
    dbias[i] += sums[dim + i];
  }
}

template <typename T>
void rmsNormForward(T *y, const T *x, const T *weight, int64_t rows, int64_t dim, double eps) {
  // y = x * rrms * weight
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      rmsNormRow(y + r * dim, x + r * dim, weight, dim, eps);
  });
}

template <typename T>
void residualRmsNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, int64_t rows,
                            int64_t dim, double eps) {
  // sum = a + b; y = rmsnorm(sum)
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      T *sr = sum + r * dim;
      for (int64_t i = 0; i < dim; ++i)
        sr[i] = a[r * dim + i] + b[r * dim + i];
      rmsNormRow(y + r * dim, sr, weight, dim, eps);
    }
  });
}

template <typename T>
void rmsNormBackward(T *dx, T *dweight, const T *x, const T *weight, const T *dy, int64_t rows,
                     int64_t dim, double eps) {
  // dx = rrms (g - xhat mean(g xhat)), g = dy weight; dweight += dy xhat
  auto rowsOfBlock = [&](int64_t first, int64_t last, T *part) {
    for (int64_t r = first; r < last; ++r) {
      const T *xr = x + r * dim, *dyr = dy + r * dim;
      double rrms = rmsNormRrms(xr, dim, eps), gxhatMean = 0;
      for (int64_t i = 0; i < dim; ++i) {
        double xhat = xr[i] * rrms;
        gxhatMean += double(dyr[i]) * weight[i] * xhat;
        part[i] += T(dyr[i] * xhat);
      }
      gxhatMean /= dim;
      for (int64_t i = 0; i < dim; ++i)
        dx[r * dim + i] = T(rrms * (double(dyr[i]) * weight[i] - xr[i] * rrms * gxhatMean));
    }
  };
  const T *sums = detail::sumOverRowBlocks<T>(rows, dim, rowsOfBlock);
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
  template void residualRmsNormForward(T *, T *, const T *, const T *, const T *, int64_t, int64_t, \
                                       double);                                                    \
  template void rmsNormBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t,       \
                                double);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
