//===- Optimizer.cpp - AdamW, SGD and the pieces of gradient clipping -----===//
//
// The update arithmetic runs in double whatever T is, so fp32 runs differ from fp64 ones by
// the storage rounding of parameters and moments only.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include <cmath>

namespace parc::runtime::cpu {

template <typename T>
void adamwStep(T *param, const T *grad, T *m, T *v, int64_t n, const AdamWConfig &config) {
  // p -= lr wd p; m, v moving moments; p -= lr mhat / (sqrt(vhat) + eps)
  double correction1 = 1.0 - std::pow(config.beta1, double(config.step));
  double correction2 = 1.0 - std::pow(config.beta2, double(config.step));
  for (int64_t i = 0; i < n; ++i) {
    double p = param[i] * (1.0 - config.lr * config.weightDecay), g = grad[i];
    double mi = config.beta1 * m[i] + (1.0 - config.beta1) * g;
    double vi = config.beta2 * v[i] + (1.0 - config.beta2) * g * g;
    m[i] = T(mi);
    v[i] = T(vi);
    param[i] = T(p - config.lr * (mi / correction1) / (std::sqrt(vi / correction2) + config.eps));
  }
}

template <typename T>
void sgdStep(T *param, const T *grad, T *momentumBuffer, int64_t n, const SGDConfig &config) {
  // g' = g + wd p; buf = momentum buf + g'; p -= lr buf
  for (int64_t i = 0; i < n; ++i) {
    double step = grad[i] + config.weightDecay * param[i];
    if (config.momentum != 0.0) {
      step += config.momentum * momentumBuffer[i];
      momentumBuffer[i] = T(step);
    }
    param[i] = T(param[i] - config.lr * step);
  }
}

template <typename T> double squaredSum(const T *x, int64_t n) {
  // sum x^2
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += double(x[i]) * x[i];
  return sum;
}

template <typename T> void scale(T *x, int64_t n, double factor) {
  // x *= factor
  for (int64_t i = 0; i < n; ++i)
    x[i] = T(x[i] * factor);
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
