//===- Norm.cu - layernorm and rmsnorm, plain and fused with residual_add -===//
//
// One block per row; every thread keeps to the same elements in every pass over the row, so
// a fused kernel can write the residual sum and read it back without a barrier. Statistics
// are two-pass (mean, then the mean of squared deviations) in fp32. The backward writes the
// row statistics to a scratch buffer, adds the parameter gradients from it with columnSumAdd
// and only then writes dx, so dx may overwrite dy.
//
//===----------------------------------------------------------------------===//

#include "Common.cuh"

namespace parc::runtime::cuda {

using namespace detail;

namespace {

struct RowStats {
  float mean, rstd; // rmsnorm: mean = 0, rstd = 1 / rms
};

// mean and 1 / sqrt(biased variance + eps), or 1 / sqrt(mean(x^2) + eps) when !centered
template <typename T>
__device__ RowStats rowStats(const T *x, int64_t dim, float eps, bool centered) {
  float mean = 0;
  if (centered) {
    float sum = 0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      sum += toFloat(x[i]);
    mean = blockReduce(sum, SumOp(), 0.0f) / float(dim);
  }
  float squares = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float d = toFloat(x[i]) - mean;
    squares += d * d;
  }
  float var = blockReduce(squares, SumOp(), 0.0f) / float(dim);
  return {mean, 1.0f / sqrtf(var + eps)};
}

// sum = a + b when b is given (then normalised instead of a); y = (x - mean) rstd weight + bias
template <typename T>
__global__ void normForwardKernel(T *y, T *sum, const T *a, const T *b, const T *weight,
                                  const T *bias, int64_t dim, float eps, bool centered) {
  int64_t offset = blockIdx.x * dim;
  const T *x = a + offset;
  if (b) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      sum[offset + i] = fromFloat<T>(toFloat(a[offset + i]) + toFloat(b[offset + i]));
    x = sum + offset;
  }
  RowStats stats = rowStats(x, dim, eps, centered);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float value = (toFloat(x[i]) - stats.mean) * stats.rstd * toFloat(weight[i]);
    y[offset + i] = fromFloat<T>(bias ? value + toFloat(bias[i]) : value);
  }
}

// stats[r] = (mean, rstd) of row r
template <typename T>
__global__ void normStatsKernel(RowStats *stats, const T *x, int64_t dim, float eps,
                                bool centered) {
  RowStats row = rowStats(x + blockIdx.x * dim, dim, eps, centered);
  if (threadIdx.x == 0)
    stats[blockIdx.x] = row;
}

// g = dy weight: dx = rstd (g - mean(g) - xhat mean(g xhat)); without centering no mean(g)
template <typename T>
__global__ void normBackwardKernel(T *dx, const T *x, const T *weight, const T *dy,
                                   const RowStats *stats, int64_t dim, bool centered) {
  int64_t offset = blockIdx.x * dim;
  RowStats row = stats[blockIdx.x];
  float gSum = 0, gxhatSum = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float g = toFloat(dy[offset + i]) * toFloat(weight[i]);
    gSum += g;
    gxhatSum += g * (toFloat(x[offset + i]) - row.mean) * row.rstd;
  }
  float gMean = centered ? blockReduce(gSum, SumOp(), 0.0f) / float(dim) : 0.0f;
  float gxhatMean = blockReduce(gxhatSum, SumOp(), 0.0f) / float(dim);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float g = toFloat(dy[offset + i]) * toFloat(weight[i]);
    float xhat = (toFloat(x[offset + i]) - row.mean) * row.rstd;
    dx[offset + i] = fromFloat<T>(row.rstd * (g - gMean - xhat * gxhatMean));
  }
}

template <typename T>
void normForward(T *y, T *sum, const T *a, const T *b, const T *weight, const T *bias, int64_t rows,
                 int64_t dim, double eps, bool centered, cudaStream_t stream, const char *kernel) {
  if (rows <= 0 || dim <= 0)
    return;
  normForwardKernel<<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(
      y, sum, a, b, weight, bias, dim, static_cast<float>(eps), centered);
  checkLaunch(kernel);
}

// dweight += sum_r dy xhat; dbias += sum_r dy when dbias is given; then dx
template <typename T>
void normBackward(T *dx, T *dweight, T *dbias, const T *x, const T *weight, const T *dy,
                  int64_t rows, int64_t dim, double eps, bool centered, cudaStream_t stream,
                  const char *kernel) {
  if (rows <= 0 || dim <= 0)
    return;
  StreamBuffer<RowStats> stats(rows, stream, kernel);
  RowStats *rowStats = stats.get();
  normStatsKernel<<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(
      rowStats, x, dim, static_cast<float>(eps), centered);
  checkLaunch(kernel);
  columnSumAdd(dweight, rows, dim, stream, kernel, [=] __device__(int64_t r, int64_t i) {
    RowStats row = rowStats[r];
    return toFloat(dy[r * dim + i]) * (toFloat(x[r * dim + i]) - row.mean) * row.rstd;
  });
  if (dbias)
    columnSumAdd(dbias, rows, dim, stream, kernel,
                 [=] __device__(int64_t r, int64_t i) { return toFloat(dy[r * dim + i]); });
  normBackwardKernel<<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(dx, x, weight, dy,
                                                                         rowStats, dim, centered);
  checkLaunch(kernel);
}

} // namespace

template <typename T>
void layerNormForward(T *y, const T *x, const T *weight, const T *bias, int64_t rows, int64_t dim,
                      double eps, cudaStream_t stream) {
  // y = (x - mean) rstd weight + bias
  normForward<T>(y, nullptr, x, nullptr, weight, bias, rows, dim, eps, true, stream,
                 "layerNormForward");
}

template <typename T>
void layerNormBackward(T *dx, T *dweight, T *dbias, const T *x, const T *weight, const T *dy,
                       int64_t rows, int64_t dim, double eps, cudaStream_t stream) {
  // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy weight; dweight += dy xhat; dbias += dy
  normBackward(dx, dweight, dbias, x, weight, dy, rows, dim, eps, true, stream,
               "layerNormBackward");
}

template <typename T>
void rmsNormForward(T *y, const T *x, const T *weight, int64_t rows, int64_t dim, double eps,
                    cudaStream_t stream) {
  // y = x rrms weight
  normForward<T>(y, nullptr, x, nullptr, weight, nullptr, rows, dim, eps, false, stream,
                 "rmsNormForward");
}

template <typename T>
void rmsNormBackward(T *dx, T *dweight, const T *x, const T *weight, const T *dy, int64_t rows,
                     int64_t dim, double eps, cudaStream_t stream) {
  // dx = rrms (g - xhat mean(g xhat)), g = dy weight; dweight += dy xhat
  normBackward<T>(dx, dweight, nullptr, x, weight, dy, rows, dim, eps, false, stream,
                  "rmsNormBackward");
}

template <typename T>
void residualLayerNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, const T *bias,
                              int64_t rows, int64_t dim, double eps, cudaStream_t stream) {
  // sum = a + b; y = layernorm(sum)
  normForward(y, sum, a, b, weight, bias, rows, dim, eps, true, stream, "residualLayerNormForward");
}

template <typename T>
void residualRmsNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, int64_t rows,
                            int64_t dim, double eps, cudaStream_t stream) {
  // sum = a + b; y = rmsnorm(sum)
  normForward<T>(y, sum, a, b, weight, nullptr, rows, dim, eps, false, stream,
                 "residualRmsNormForward");
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void layerNormForward(T *, const T *, const T *, const T *, int64_t, int64_t, double,   \
                                 cudaStream_t);                                                    \
  template void layerNormBackward(T *, T *, T *, const T *, const T *, const T *, int64_t,         \
                                  int64_t, double, cudaStream_t);                                  \
  template void rmsNormForward(T *, const T *, const T *, int64_t, int64_t, double, cudaStream_t); \
  template void rmsNormBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t,       \
                                double, cudaStream_t);                                             \
  template void residualLayerNormForward(T *, T *, const T *, const T *, const T *, const T *,     \
                                         int64_t, int64_t, double, cudaStream_t);                  \
  template void residualRmsNormForward(T *, T *, const T *, const T *, const T *, int64_t,         \
                                       int64_t, double, cudaStream_t);
PARC_CUDA_FOR_STORAGE_TYPES(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cuda
