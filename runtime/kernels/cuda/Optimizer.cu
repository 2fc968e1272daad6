//===- Optimizer.cu - AdamW, SGD, gradient clipping, precision conversion -===//
//
// The updates run in fp64 registers as on the CPU (they are memory-bound, and sm_80/sm_90
// have full-rate fp64 to spare), so an fp32 run differs from the CPU's by rounding order
// only. squaredSum is a two-pass reduction with a block count that depends on n alone.
//
//===----------------------------------------------------------------------===//

#include "Common.cuh"

#include <cmath>

namespace parc::runtime::cuda {

using namespace detail;

namespace {

// partial[block] = sum of x^2 over the block's grid-stride elements
template <typename T> __global__ void squaredPartialKernel(double *partial, const T *x, int64_t n) {
  double sum = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double value = toDouble(x[i]);
    sum += value * value;
  }
  sum = blockReduce(sum, SumOp(), 0.0);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = sum;
}

// *total += sum_b partial[b]
__global__ void squaredFinishKernel(double *total, const double *partial, int64_t parts) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < parts; i += blockDim.x)
    sum += partial[i];
  sum = blockReduce(sum, SumOp(), 0.0);
  if (threadIdx.x == 0)
    *total += sum;
}

} // namespace

template <typename T>
void adamwStep(T *param, const T *grad, T *m, T *v, int64_t n, const AdamWConfig &config,
               cudaStream_t stream) {
  // p -= lr wd p; m, v moving moments; p -= lr mhat / (sqrt(vhat) + eps)
  // The factors of AdamWConfig, as the CPU's kernel applies them, here in double (the CPU's
  // fp32 step runs in float; this kernel has not been timed on a GPU). nvcc contracts
  // multiply-adds (the moments', sqrt(v) * c + eps) where the CPU rounds each operation, so
  // the two agree to rounding, not bit for bit.
  double stepSize = config.stepSize(), rootCorrection2 = config.rootCorrection2();
  double beta1 = config.beta1, beta2 = config.beta2, eps = config.eps;
  double decay = config.decayFactor(), gradScale = config.gradScale;
  forEach(n, stream, "adamwStep", [=] __device__(int64_t i) {
    // g rounded to T after scaling, as the CPU's (and as scale() in place would leave it)
    double p = toDouble(param[i]) * decay;
    double g = toDouble(fromDouble<T>(toDouble(grad[i]) * gradScale));
    double mi = beta1 * toDouble(m[i]) + (1.0 - beta1) * g;
    double vi = beta2 * toDouble(v[i]) + (1.0 - beta2) * g * g;
    m[i] = fromDouble<T>(mi);
    v[i] = fromDouble<T>(vi);
    param[i] = fromDouble<T>(p - stepSize * mi / (sqrt(vi) * rootCorrection2 + eps));
  });
}

template <typename T>
void sgdStep(T *param, const T *grad, T *momentumBuffer, int64_t n, const SGDConfig &config,
             cudaStream_t stream) {
  // g' = g + wd p; buf = momentum buf + g'; p -= lr buf
  double lr = config.lr, momentum = config.momentum, decay = config.weightDecay;
  double gradScale = config.gradScale;
  forEach(n, stream, "sgdStep", [=] __device__(int64_t i) {
    double p = toDouble(param[i]);
    double step = toDouble(fromDouble<T>(toDouble(grad[i]) * gradScale)) + decay * p;
    if (momentum != 0.0) {
      step += momentum * toDouble(momentumBuffer[i]);
      momentumBuffer[i] = fromDouble<T>(step);
    }
    param[i] = fromDouble<T>(p - lr * step);
  });
}

template <typename T> void squaredSum(double *sum, const T *x, int64_t n, cudaStream_t stream) {
  // *sum += sum x^2
  if (n <= 0)
    return;
  unsigned blocks = blocksFor(n);
  StreamBuffer<double> partial(blocks, stream, "squaredSum");
  squaredPartialKernel<<<blocks, kBlock, 0, stream>>>(partial.get(), x, n);
  checkLaunch("squaredSum");
  squaredFinishKernel<<<1, kBlock, 0, stream>>>(sum, partial.get(), blocks);
  checkLaunch("squaredSum");
}

template <typename T> void scale(T *x, int64_t n, double factor, cudaStream_t stream) {
  // x *= factor
  forEach(n, stream, "scale",
          [=] __device__(int64_t i) { x[i] = fromDouble<T>(toDouble(x[i]) * factor); });
}

template <typename To, typename From>
void convert(To *y, const From *x, int64_t n, cudaStream_t stream) {
  // y = round_To(x)
  forEach(n, stream, "convert", [=] __device__(int64_t i) { y[i] = fromFloat<To>(toFloat(x[i])); });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void adamwStep(T *, const T *, T *, T *, int64_t, const AdamWConfig &, cudaStream_t);   \
  template void sgdStep(T *, const T *, T *, int64_t, const SGDConfig &, cudaStream_t);            \
  template void squaredSum(double *, const T *, int64_t, cudaStream_t);                            \
  template void scale(T *, int64_t, double, cudaStream_t);
PARC_CUDA_FOR_STORAGE_TYPES(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

template void convert(__nv_bfloat16 *, const float *, int64_t, cudaStream_t);
template void convert(float *, const __nv_bfloat16 *, int64_t, cudaStream_t);
template void convert(__half *, const float *, int64_t, cudaStream_t);
template void convert(float *, const __half *, int64_t, cudaStream_t);

} // namespace parc::runtime::cuda
