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

[[gnu::always_inline]] inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
// e^-|x| never overflows, so a very negative x keeps its tiny sigmoid (expf clamps large
// arguments, and 1 / (1 + e^-x) would give 1 / (1 + e^88) there).
[[gnu::always_inline]] inline float sigmoid(float x) {
  float e = detail::expf(-std::fabs(x));
  return (x >= 0 ? 1.0f : e) / (1.0f + e);
}
} // namespace

namespace {
// 1 + erf(x / sqrt(2)) and exp(-x^2 / 2), in float.
[[gnu::always_inline]] inline void geluParts(float x, float &onePlusErf, float &gaussian) {
  float a = std::fabs(x) * float(invSqrt2);
  gaussian = detail::expf(-a * a);
  float erfc = detail::erfcPositive(a, gaussian);
  onePlusErf = x >= 0 ? 2.0f - erfc : erfc;
}
[[gnu::always_inline]] inline float gelu(float x) {
  float onePlusErf, gaussian;
  geluParts(x, onePlusErf, gaussian);
  return 0.5f * x * onePlusErf;
}
[[gnu::always_inline]] inline float geluGrad(float x, float dy) {
  float onePlusErf, gaussian;
  geluParts(x, onePlusErf, gaussian);
  return dy * (0.5f * onePlusErf + x * float(invSqrt2Pi) * gaussian);
}
[[gnu::always_inline]] inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::erf(x * invSqrt2));
}
[[gnu::always_inline]] inline double geluGrad(double x, double dy) {
  double cdf = 0.5 * (1.0 + std::erf(x * invSqrt2));
  double pdf = invSqrt2Pi * std::exp(-0.5 * x * x);
  return dy * (cdf + x * pdf);
}

// Each kernel's loop, one function per type so that the float ones get their AVX-512 and AVX2
// clones (clang clones no templates). The fused ones round x + bias to T first, as bias_add
// then gelu would, in the same pass.
template <typename T>
[[gnu::always_inline]] inline void biasGeluBackwardLoop(T *dx, T *part, const T *x,
                                                        const T *bias, const T *dy,
                                                        int64_t first, int64_t last,
                                                        int64_t dim) {
  for (int64_t r = first; r < last; ++r) {
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) {
      T grad = geluGrad(T(x[r * dim + i] + bias[i]), dy[r * dim + i]);
      dx[r * dim + i] = grad;
      part[i] += grad;
    }
  }
}

#define PARC_GELU_LOOPS(ATTR, T)                                                                   \
  ATTR void geluForwardRange(T *y, const T *x, int64_t begin, int64_t end) {                       \
    _Pragma("omp simd") for (int64_t i = begin; i < end; ++i) y[i] = gelu(x[i]);                   \
  }                                                                                                \
  ATTR void geluBackwardRange(T *dx, const T *x, const T *dy, int64_t begin, int64_t end) {        \
    _Pragma("omp simd") for (int64_t i = begin; i < end; ++i) dx[i] = geluGrad(x[i], dy[i]);       \
  }                                                                                                \
  ATTR void biasGeluRows(T *y, const T *x, const T *bias, int64_t f, int64_t l, int64_t d) {       \
    detail::mapBiasedRows(y, x, bias, f, l, d, [](T v) PARC_INLINE_LAMBDA { return gelu(v); });    \
  }                                                                                                \
  ATTR void biasGeluBackwardRows(T *dx, T *part, const T *x, const T *bias, const T *dy,           \
                                 int64_t f, int64_t l, int64_t d) {                                \
    biasGeluBackwardLoop(dx, part, x, bias, dy, f, l, d);                                          \
  }
PARC_GELU_LOOPS(PARC_VECTOR_CLONES, float)
PARC_GELU_LOOPS(, double)
#undef PARC_GELU_LOOPS

#define PARC_SWIGLU_LOOPS(ATTR, T)                                                                 \
  ATTR void swigluForwardRange(T *y, const T *gate, const T *up, int64_t begin, int64_t end) {     \
    _Pragma("omp simd") for (int64_t i = begin; i < end; ++i) y[i] =                               \
        gate[i] * sigmoid(gate[i]) * up[i];                                                        \
  }                                                                                                \
  ATTR void swigluBackwardRange(T *dgate, T *dup, const T *gate, const T *up, const T *dy,         \
                                int64_t begin, int64_t end) {                                      \
    _Pragma("omp simd") for (int64_t i = begin; i < end; ++i) {                                    \
      T g = gate[i], s = sigmoid(g);                                                               \
      dgate[i] = dy[i] * up[i] * s * (T(1) + g * (T(1) - s));                                      \
      dup[i] = dy[i] * g * s;                                                                      \
    }                                                                                              \
  }
PARC_SWIGLU_LOOPS(PARC_VECTOR_CLONES, float)
PARC_SWIGLU_LOOPS(, double)
#undef PARC_SWIGLU_LOOPS
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
  // y = gelu(x + bias)
  detail::forRows(rows, dim, [&](int64_t first, int64_t last) {
    biasGeluRows(y, x, bias, first, last, dim);
  });
}

template <typename T>
void biasGeluBackward(T *dx, T *dbias, const T *x, const T *bias, const T *dy, int64_t rows,
                      int64_t dim) {
  // dx = dy gelu'(x + bias); dbias += sum_r dx, in the blocks of biasAddBackward
  const T *sums = detail::sumOverRowBlocks<T>(rows, dim, [&](int64_t first, int64_t last, T *part) {
    biasGeluBackwardRows(dx, part, x, bias, dy, first, last, dim);
  });
  for (int64_t i = 0; i < dim; ++i)
    dbias[i] += sums[i];
}

template <typename T>
void swigluForward(T *y, const T *gate, const T *up, int64_t rows, int64_t ffn) {
  // y = silu(gate) * up
  detail::forElements(rows * ffn, [&](int64_t begin, int64_t end) {
    swigluForwardRange(y, gate, up, begin, end);
  });
}

template <typename T>
void swigluBackward(T *dgate, T *dup, const T *gate, const T *up, const T *dy, int64_t rows,
                    int64_t ffn) {
  // dgate = dy up sigmoid(g) (1 + g (1 - sigmoid(g))), dup = dy silu(g)
  detail::forElements(rows * ffn, [&](int64_t begin, int64_t end) {
    swigluBackwardRange(dgate, dup, gate, up, dy, begin, end);
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
