//===- Activation.cpp - exact GELU and SwiGLU -----------------------------===//
//
// Transcendentals are evaluated in double and rounded once, so the fp32 kernels differ from
// the fp64 ones only by that final rounding.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include <cmath>

namespace parc::runtime::cpu {

namespace {
constexpr double invSqrt2 = 0.70710678118654752440;
constexpr double invSqrt2Pi = 0.39894228040143267794;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
} // namespace

template <typename T> void geluForward(T *y, const T *x, int64_t n) {
  // y = 0.5 x (1 + erf(x / sqrt(2)))
  for (int64_t i = 0; i < n; ++i)
    y[i] = T(0.5 * x[i] * (1.0 + std::erf(x[i] * invSqrt2)));
}

template <typename T> void geluBackward(T *dx, const T *x, const T *dy, int64_t n) {
  // dx = dy (Phi(x) + x phi(x))
  for (int64_t i = 0; i < n; ++i) {
    double xi = x[i];
    double cdf = 0.5 * (1.0 + std::erf(xi * invSqrt2));
    double pdf = invSqrt2Pi * std::exp(-0.5 * xi * xi);
    dx[i] = T(dy[i] * (cdf + xi * pdf));
  }
}

template <typename T>
void swigluForward(T *y, const T *gate, const T *up, int64_t rows, int64_t ffn) {
  // y = silu(gate) * up
  for (int64_t i = 0; i < rows * ffn; ++i)
    y[i] = T(gate[i] * sigmoid(gate[i]) * up[i]);
}

template <typename T>
void swigluBackward(T *dgate, T *dup, const T *gate, const T *up, const T *dy, int64_t rows,
                    int64_t ffn) {
  // dgate = dy up sigmoid(g) (1 + g (1 - sigmoid(g))), dup = dy silu(g)
  for (int64_t i = 0; i < rows * ffn; ++i) {
    double g = gate[i], s = sigmoid(g);
    dgate[i] = T(dy[i] * up[i] * s * (1.0 + g * (1.0 - s)));
    dup[i] = T(dy[i] * g * s);
  }
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void geluForward(T *, const T *, int64_t);                                              \
  template void geluBackward(T *, const T *, const T *, int64_t);                                  \
  template void swigluForward(T *, const T *, const T *, int64_t, int64_t);                        \
  template void swigluBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
