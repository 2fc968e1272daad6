//===- Activation.cpp - exact GELU and SwiGLU -----------------------------===//
//
// In fp64 the transcendentals come from libm in double. In fp32 they are VecMath.h's float
// approximations (about 1e-7 relative, what torch's vectorised GELU uses) in loops that
// vectorise; every kernel runs over ranges of elements on the kernel threads (Rows.h).
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Rows.h"
#include "VecMath.h"

#include <cmath>

namespace parc::runtime::cpu {

namespace {
constexpr double invSqrt2 = 0.70710678118654752440;
constexpr double invSqrt2Pi = 0.39894228040143267794;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
} // namespace

namespace {
// 1 + erf(x / sqrt(2)) and exp(-x^2 / 2), in float.
inline void geluParts(float x, float &onePlusErf, float &gaussian) {
  float a = std::fabs(x) * float(invSqrt2);
  gaussian = detail::expf(-a * a);
  float erfc = detail::erfcPositive(a, gaussian);
  onePlusErf = x >= 0 ? 2.0f - erfc : erfc;
}

PARC_VECTOR_CLONES void geluForwardRange(float *y, const float *x, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float onePlusErf, gaussian;
    geluParts(x[i], onePlusErf, gaussian);
    y[i] = 0.5f * x[i] * onePlusErf;
  }
}

PARC_VECTOR_CLONES void geluBackwardRange(float *dx, const float *x, const float *dy, int64_t begin,
                                          int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float onePlusErf, gaussian;
    geluParts(x[i], onePlusErf, gaussian);
    dx[i] = dy[i] * (0.5f * onePlusErf + x[i] * float(invSqrt2Pi) * gaussian);
  }
}

void geluForwardRange(double *y, const double *x, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i)
    y[i] = 0.5 * x[i] * (1.0 + std::erf(x[i] * invSqrt2));
}

void geluBackwardRange(double *dx, const double *x, const double *dy, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    double xi = x[i];
    double cdf = 0.5 * (1.0 + std::erf(xi * invSqrt2));
    double pdf = invSqrt2Pi * std::exp(-0.5 * xi * xi);
    dx[i] = dy[i] * (cdf + xi * pdf);
  }
}
} // namespace

template <typename T> void geluForward(T *y, const T *x, int64_t n) {
  // y = 0.5 x (1 + erf(x / sqrt(2)))
  detail::forElements(n, [&](int64_t begin, int64_t end) { geluForwardRange(y, x, begin, end); });
}

template <typename T> void geluBackward(T *dx, const T *x, const T *dy, int64_t n) {
  // dx = dy (Phi(x) + x phi(x))
  detail::forElements(n,
                      [&](int64_t begin, int64_t end) { geluBackwardRange(dx, x, dy, begin, end); });
}

template <typename T>
void biasGeluForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim) {
  // y = gelu(x + bias): the sum is rounded to T first, as bias_add then gelu would
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      T *yr = y + r * dim;
      const T *xr = x + r * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i)
        yr[i] = xr[i] + bias[i];
      geluForwardRange(yr, yr, 0, dim);
    }
  });
}

template <typename T>
void biasGeluBackward(T *dx, T *dbias, const T *x, const T *bias, const T *dy, int64_t rows,
                      int64_t dim) {
  // dx = dy gelu'(x + bias); dbias += sum_r dx, in the blocks of biasAddBackward
  const T *sums = detail::sumOverRowBlocks<T>(rows, dim, [&](int64_t first, int64_t last, T *part) {
    for (int64_t r = first; r < last; ++r) {
      T *dxr = dx + r * dim;
      const T *xr = x + r * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i)
        dxr[i] = xr[i] + bias[i];
      geluBackwardRange(dxr, dxr, dy + r * dim, 0, dim);
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i)
        part[i] += dxr[i];
    }
  });
  for (int64_t i = 0; i < dim; ++i)
    dbias[i] += sums[i];
}

template <typename T>
void swigluForward(T *y, const T *gate, const T *up, int64_t rows, int64_t ffn) {
  // y = silu(gate) * up
  detail::forElements(rows * ffn, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      y[i] = T(gate[i] * sigmoid(gate[i]) * up[i]);
  });
}

template <typename T>
void swigluBackward(T *dgate, T *dup, const T *gate, const T *up, const T *dy, int64_t rows,
                    int64_t ffn) {
  // dgate = dy up sigmoid(g) (1 + g (1 - sigmoid(g))), dup = dy silu(g)
  detail::forElements(rows * ffn, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      double g = gate[i], s = sigmoid(g);
      dgate[i] = T(dy[i] * up[i] * s * (1.0 + g * (1.0 - s)));
      dup[i] = T(dy[i] * g * s);
    }
  });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void geluForward(T *, const T *, int64_t);                                              \
  template void geluBackward(T *, const T *, const T *, int64_t);                                  \
  template void biasGeluForward(T *, const T *, const T *, int64_t, int64_t);                      \
  template void biasGeluBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t);     \
  template void swigluForward(T *, const T *, const T *, int64_t, int64_t);                        \
  template void swigluBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
