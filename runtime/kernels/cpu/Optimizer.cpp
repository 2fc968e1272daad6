//===- Optimizer.cpp - AdamW, SGD and the pieces of gradient clipping -----===//
//
// AdamW's arithmetic is T's; SGD's runs in double whatever T is. Each kernel is one
// vectorised pass over its buffers on the kernel threads; the squared sum adds fixed-size
// blocks in order, the same bits for any number of threads.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Rows.h"
#include "VecMath.h"

#include <cmath>
#include <vector>

namespace parc::runtime::cpu {

namespace {
// AdamW's per-step constants (AdamWConfig's factors) in T, read by every element.
template <typename T> struct AdamWTerms {
  T stepSize, rootCorrection2, decay, beta1, beta2, eps, oneMinusBeta1, oneMinusBeta2;
  double gradScale; // g = round_T(grad gradScale), the bits scale() in place would leave
};

// In T's own arithmetic, as torch.optim.AdamW's: in double, a float step waited on double
// square roots and divisions (0.99 ns an element against 0.32 in float, 1M elements on one of
// these cores), its moments and parameters rounded back to float anyway.
template <typename T>
[[gnu::always_inline]] inline void adamwElements(T *param, const T *grad, T *m, T *v,
                                                 int64_t begin, int64_t end,
                                                 const AdamWTerms<T> &c) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    T p = param[i] * c.decay, g = T(grad[i] * c.gradScale);
    T mi = c.beta1 * m[i] + c.oneMinusBeta1 * g;
    T vi = c.beta2 * v[i] + c.oneMinusBeta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - c.stepSize * mi / (std::sqrt(vi) * c.rootCorrection2 + c.eps);
  }
}

// By overload, the float one with its AVX-512 and AVX2 clones (VecMath.h; clang clones no
// templates).
PARC_VECTOR_CLONES void adamwRange(float *param, const float *grad, float *m, float *v,
                                   int64_t begin, int64_t end, const AdamWTerms<float> &terms) {
  adamwElements(param, grad, m, v, begin, end, terms);
}
void adamwRange(double *param, const double *grad, double *m, double *v, int64_t begin,
                int64_t end, const AdamWTerms<double> &terms) {
  adamwElements(param, grad, m, v, begin, end, terms);
}
template <typename T>
[[gnu::always_inline]] inline void scaleElements(T *x, int64_t begin, int64_t end,
                                                 double factor) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i)
    x[i] = T(x[i] * factor);
}
PARC_VECTOR_CLONES void scaleRange(float *x, int64_t begin, int64_t end, double factor) {
  scaleElements(x, begin, end, factor);
}
void scaleRange(double *x, int64_t begin, int64_t end, double factor) {
  scaleElements(x, begin, end, factor);
}
// sum x^2 of one block, in 32 fixed lanes: independent chains of double adds that fill
// AVX-512's two adders where one running sum waits on each add's latency.
template <typename T>
[[gnu::always_inline]] inline double blockSquaresOf(const T *x, int64_t n) {
  return detail::laneSum<double, 32>(n, [&](int64_t i) { return double(x[i]) * x[i]; });
}
PARC_VECTOR_CLONES double blockSquares(const float *x, int64_t n) { return blockSquaresOf(x, n); }
double blockSquares(const double *x, int64_t n) { return blockSquaresOf(x, n); }
} // namespace

template <typename T>
void adamwStep(T *param, const T *grad, T *m, T *v, int64_t n, const AdamWConfig &config) {
  // p -= lr wd p; m, v moving moments; p -= lr mhat / (sqrt(vhat) + eps)
  AdamWTerms<T> terms{T(config.stepSize()),  T(config.rootCorrection2()),
                      T(config.decayFactor()), T(config.beta1),
                      T(config.beta2),         T(config.eps),
                      T(1.0 - config.beta1),   T(1.0 - config.beta2),
                      config.gradScale};
  detail::forElements(n, [&](int64_t begin, int64_t end) {
    adamwRange(param, grad, m, v, begin, end, terms);
  });
}

template <typename T>
void sgdStep(T *param, const T *grad, T *momentumBuffer, int64_t n, const SGDConfig &config) {
  // g' = g + wd p; buf = momentum buf + g'; p -= lr buf
  detail::forElements(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      double step = T(grad[i] * config.gradScale) + config.weightDecay * param[i];
      if (config.momentum != 0.0) {
        step += config.momentum * momentumBuffer[i];
        momentumBuffer[i] = T(step);
      }
      param[i] = T(param[i] - config.lr * step);
    }
  });
}

template <typename T> double squaredSum(const T *x, int64_t n) {
  // sum x^2, in blocks of a fixed size added in order
  constexpr int64_t block = 4096;
  int64_t blocks = (n + block - 1) / block;
  thread_local std::vector<double> partials;
  partials.assign(size_t(blocks), 0.0);
  double *blockSums = partials.data(); // the workers' own `partials` are other vectors
  detail::parallelFor(blocks, detail::elementGrain / block + 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b)
      blockSums[b] = blockSquares(x + b * block, std::min(n, (b + 1) * block) - b * block);
  });
  double sum = 0;
  for (double partial : partials)
    sum += partial;
  return sum;
}

template <typename T> void scale(T *x, int64_t n, double factor) {
  // x *= factor
  detail::forElements(n, [&](int64_t begin, int64_t end) { scaleRange(x, begin, end, factor); });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void adamwStep(T *, const T *, T *, T *, int64_t, const AdamWConfig &);                 \
  template void sgdStep(T *, const T *, T *, int64_t, const SGDConfig &);                          \
  template double squaredSum(const T *, int64_t);                                                  \
  template void scale(T *, int64_t, double);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
