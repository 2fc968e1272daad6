//===- Elementwise.cu - fill, embeddings, bias, residual, activations, rope ===//
//
// One thread per element (grid-stride), fp32 in registers, one rounding to T. Gradients that
// sum over rows (dbias, the position table) go through columnSumAdd; the embedding's
// scatter-add walks the tokens in order per hidden column, so duplicate ids add up in the
// CPU's order without atomics.
//
//===----------------------------------------------------------------------===//

#include "Common.cuh"

#include <cub/cub.cuh>

#include <algorithm>
#include <cmath>
#include <limits>

namespace parc::runtime::cuda {

using namespace detail;

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

// Phi(x) + x phi(x), the derivative of x Phi(x)
__device__ __forceinline__ float geluGrad(float x) {
  return 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * kInvSqrt2)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// dst = src unless they are the same buffer (the dx = dy of a backward done in place).
template <typename T>
void copyIfDistinct(T *dst, const T *src, int64_t n, cudaStream_t stream, const char *kernel) {
  if (dst != src && n > 0)
    PARC_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream),
                    kernel);
}

// dweight[ids[b,t] - offset, i] += dy[t,b,i], column i's tokens in (t, b) order
/// Each token's row in this shard, numbering tokens k = t * batch + b; a token outside the
/// shard gets localRows, which sorts after every row and is skipped.
__global__ void embeddingRowsKernel(int32_t *rows, int32_t *tokens, const int64_t *ids, int64_t seq,
                                    int64_t batch, int64_t vocabOffset, int64_t localRows) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < seq * batch;
       k += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = k / batch, b = k % batch, row = ids[b * seq + t] - vocabOffset;
    rows[k] = row >= 0 && row < localRows ? int32_t(row) : int32_t(localRows);
    tokens[k] = int32_t(k);
  }
}

/// dweight[row, col] += the fp32 sum, in token order, of dy[token, col] over one run of
/// tokens with the same row (blockIdx.x the run, blockIdx.y a chunk of columns).
template <typename T>
__global__ void embeddingRunsKernel(T *dweight, const T *dy, const int32_t *sortedTokens,
                                    const int32_t *runRows, const int32_t *runLengths,
                                    const int32_t *runStarts, const int32_t *numRuns,
                                    int64_t hidden, int64_t localRows) {
  int64_t run = blockIdx.x, col = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (run >= *numRuns || col >= hidden || runRows[run] >= localRows)
    return;
  float sum = 0;
  for (int32_t i = runStarts[run], end = runStarts[run] + runLengths[run]; i < end; ++i)
    sum += toFloat(dy[int64_t(sortedTokens[i]) * hidden + col]);
  T *out = dweight + int64_t(runRows[run]) * hidden + col;
  *out = fromFloat<T>(toFloat(*out) + sum);
}

// (y1, y2) = (x1 cos - x2 sin, x2 cos + x1 sin) at angle t * theta^(-2j/d), times direction
template <typename T>
void rotateHalves(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                  double theta, double direction, int64_t offset, cudaStream_t stream,
                  const char *kernel) {
  if (headDim % 2 != 0)
    throwCallFailed(kernel, "argument check", "rotary embedding needs an even head size", __FILE__,
                    __LINE__);
  int64_t half = headDim / 2, perPosition = batch * heads * half;
  forEach(seq * perPosition, stream, kernel, [=] __device__(int64_t p) {
    int64_t t = p / perPosition, j = p % half, base = (p / half) * headDim;
    double angle = double(offset + t) * pow(theta, -2.0 * double(j) / double(headDim)), s, c;
    sincos(angle, &s, &c);
    s *= direction;
    double x1 = toDouble(x[base + j]), x2 = toDouble(x[base + j + half]);
    y[base + j] = fromDouble<T>(x1 * c - x2 * s);
    y[base + j + half] = fromDouble<T>(x2 * c + x1 * s);
  });
}
} // namespace

template <typename T>
void embeddingForward(T *y, const int64_t *ids, const T *weight, int64_t seq, int64_t batch,
                      int64_t hidden, int64_t vocabOffset, int64_t localRows, cudaStream_t stream) {
  // y[t,b,:] = weight[ids[b,t] - vocabOffset], or 0 outside this shard's rows
  forEach(seq * batch * hidden, stream, "embeddingForward", [=] __device__(int64_t e) {
    int64_t token = e / hidden, t = token / batch, b = token % batch;
    int64_t row = ids[b * seq + t] - vocabOffset;
    y[e] = row >= 0 && row < localRows ? weight[row * hidden + e % hidden] : fromFloat<T>(0.0f);
  });
}

template <typename T>
void embeddingBackward(T *dweight, const int64_t *ids, const T *dy, int64_t seq, int64_t batch,
                       int64_t hidden, int64_t vocabOffset, int64_t localRows,
                       cudaStream_t stream) {
  // dweight[ids[b,t] - vocabOffset] += dy[t,b,:] for ids in this shard. The tokens are sorted
  // by row (a stable radix sort keeps token order within a row), and each run of equal rows
  // is summed in fp32 and added once: a bf16 table would lose a frequent token's gradient if
  // every occurrence were added to it in turn, and one thread per column would serialise over
  // every token.
  const char *kernel = "embeddingBackward";
  int64_t n = seq * batch;
  if (hidden <= 0 || n <= 0)
    return;
  if (n > std::numeric_limits<int32_t>::max() || localRows >= std::numeric_limits<int32_t>::max())
    throwCallFailed(kernel, "argument check", "more than 2^31 tokens or table rows", __FILE__,
                    __LINE__);
  StreamBuffer<int32_t> rows(size_t(n), stream, kernel), tokens(size_t(n), stream, kernel),
      sortedRows(size_t(n), stream, kernel), sortedTokens(size_t(n), stream, kernel),
      runRows(size_t(n), stream, kernel), runLengths(size_t(n), stream, kernel),
      runStarts(size_t(n), stream, kernel), numRuns(1, stream, kernel);
  embeddingRowsKernel<<<blocksFor(n), kBlock, 0, stream>>>(rows.get(), tokens.get(), ids, seq,
                                                           batch, vocabOffset, localRows);
  checkLaunch(kernel);
  // Lengths past the last run stay 0, so the scan over all n entries stays small.
  PARC_CUDA_CHECK(cudaMemsetAsync(runLengths.get(), 0, size_t(n) * sizeof(int32_t), stream),
                  kernel);
  int endBit = 1;
  while ((int64_t(1) << endBit) <= localRows)
    ++endBit;
  int items = int(n);
  size_t sortBytes = 0, encodeBytes = 0, scanBytes = 0;
  PARC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sortBytes, rows.get(), sortedRows.get(),
                                                  tokens.get(), sortedTokens.get(), items, 0,
                                                  endBit, stream),
                  kernel);
  PARC_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, encodeBytes, sortedRows.get(),
                                                     runRows.get(), runLengths.get(), numRuns.get(),
                                                     items, stream),
                  kernel);
  PARC_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scanBytes, runLengths.get(),
                                                runStarts.get(), items, stream),
                  kernel);
  size_t tempBytes = std::max({sortBytes, encodeBytes, scanBytes, size_t(1)});
  StreamBuffer<unsigned char> temp(tempBytes, stream, kernel);
  PARC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), sortBytes, rows.get(),
                                                  sortedRows.get(), tokens.get(),
                                                  sortedTokens.get(), items, 0, endBit, stream),
                  kernel);
  PARC_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp.get(), encodeBytes, sortedRows.get(),
                                                     runRows.get(), runLengths.get(), numRuns.get(),
                                                     items, stream),
                  kernel);
  PARC_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.get(), scanBytes, runLengths.get(),
                                                runStarts.get(), items, stream),
                  kernel);
  dim3 grid(unsigned(n), unsigned((hidden + kBlock - 1) / kBlock));
  embeddingRunsKernel<<<grid, kBlock, 0, stream>>>(dweight, dy, sortedTokens.get(), runRows.get(),
                                                   runLengths.get(), runStarts.get(), numRuns.get(),
                                                   hidden, localRows);
  checkLaunch(kernel);
}

template <typename T>
void positionEmbeddingForward(T *y, const T *x, const T *weight, int64_t seq, int64_t batch,
                              int64_t hidden, cudaStream_t stream) {
  // y[t,b,:] = x[t,b,:] + weight[t,:]
  forEach(seq * batch * hidden, stream, "positionEmbeddingForward", [=] __device__(int64_t e) {
    int64_t t = e / (batch * hidden);
    y[e] = fromFloat<T>(toFloat(x[e]) + toFloat(weight[t * hidden + e % hidden]));
  });
}

template <typename T>
void positionEmbeddingBackward(T *dx, T *dweight, const T *dy, int64_t seq, int64_t batch,
                               int64_t hidden, cudaStream_t stream) {
  // dweight[t,:] += sum_b dy[t,b,:] (before dx = dy, which may overwrite dy in place)
  forEach(seq * hidden, stream, "positionEmbeddingBackward", [=] __device__(int64_t e) {
    int64_t t = e / hidden, i = e % hidden;
    float sum = 0;
    for (int64_t b = 0; b < batch; ++b)
      sum += toFloat(dy[(t * batch + b) * hidden + i]);
    dweight[e] = fromFloat<T>(toFloat(dweight[e]) + sum);
  });
  copyIfDistinct(dx, dy, seq * batch * hidden, stream, "positionEmbeddingBackward");
}

template <typename T>
void biasAddForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim,
                    cudaStream_t stream) {
  // y[r,:] = x[r,:] + bias
  forEach(rows * dim, stream, "biasAddForward", [=] __device__(int64_t e) {
    y[e] = fromFloat<T>(toFloat(x[e]) + toFloat(bias[e % dim]));
  });
}

template <typename T>
void biasAddBackward(T *dx, T *dbias, const T *dy, int64_t rows, int64_t dim, cudaStream_t stream) {
  // dbias += sum_r dy[r,:]; dx = dy
  columnSumAdd(dbias, rows, dim, stream, "biasAddBackward",
               [=] __device__(int64_t r, int64_t i) { return toFloat(dy[r * dim + i]); });
  copyIfDistinct(dx, dy, rows * dim, stream, "biasAddBackward");
}

template <typename T>
void residualAddForward(T *y, const T *a, const T *b, int64_t n, cudaStream_t stream) {
  // y = a + b
  forEach(n, stream, "residualAddForward",
          [=] __device__(int64_t e) { y[e] = fromFloat<T>(toFloat(a[e]) + toFloat(b[e])); });
}

template <typename T>
void residualAddBackward(T *da, T *db, const T *dy, int64_t n, cudaStream_t stream) {
  // da = db = dy
  copyIfDistinct(da, dy, n, stream, "residualAddBackward");
  copyIfDistinct(db, dy, n, stream, "residualAddBackward");
}

template <typename T> void geluForward(T *y, const T *x, int64_t n, cudaStream_t stream) {
  // y = 0.5 x (1 + erf(x / sqrt(2)))
  forEach(n, stream, "geluForward",
          [=] __device__(int64_t e) { y[e] = fromFloat<T>(gelu(toFloat(x[e]))); });
}

template <typename T>
void geluBackward(T *dx, const T *x, const T *dy, int64_t n, cudaStream_t stream) {
  // dx = dy (Phi(x) + x phi(x))
  forEach(n, stream, "geluBackward", [=] __device__(int64_t e) {
    dx[e] = fromFloat<T>(toFloat(dy[e]) * geluGrad(toFloat(x[e])));
  });
}

template <typename T>
void biasGeluForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim,
                     cudaStream_t stream) {
  // y = gelu(x + bias)
  forEach(rows * dim, stream, "biasGeluForward", [=] __device__(int64_t e) {
    y[e] = fromFloat<T>(gelu(toFloat(x[e]) + toFloat(bias[e % dim])));
  });
}

template <typename T>
void biasGeluBackward(T *dx, T *dbias, const T *x, const T *bias, const T *dy, int64_t rows,
                      int64_t dim, cudaStream_t stream) {
  // dx = dy gelu'(x + bias); dbias += sum_r dx[r,:]
  forEach(rows * dim, stream, "biasGeluBackward", [=] __device__(int64_t e) {
    dx[e] = fromFloat<T>(toFloat(dy[e]) * geluGrad(toFloat(x[e]) + toFloat(bias[e % dim])));
  });
  columnSumAdd(dbias, rows, dim, stream, "biasGeluBackward",
               [=] __device__(int64_t r, int64_t i) { return toFloat(dx[r * dim + i]); });
}

template <typename T>
void swigluForward(T *y, const T *gate, const T *up, int64_t rows, int64_t ffn,
                   cudaStream_t stream) {
  // y = silu(gate) * up
  forEach(rows * ffn, stream, "swigluForward", [=] __device__(int64_t e) {
    float g = toFloat(gate[e]);
    y[e] = fromFloat<T>(g * sigmoid(g) * toFloat(up[e]));
  });
}

template <typename T>
void swigluBackward(T *dgate, T *dup, const T *gate, const T *up, const T *dy, int64_t rows,
                    int64_t ffn, cudaStream_t stream) {
  // dgate = dy up sigmoid(g) (1 + g (1 - sigmoid(g))), dup = dy silu(g)
  forEach(rows * ffn, stream, "swigluBackward", [=] __device__(int64_t e) {
    float g = toFloat(gate[e]), s = sigmoid(g), d = toFloat(dy[e]), u = toFloat(up[e]);
    dgate[e] = fromFloat<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dup[e] = fromFloat<T>(d * g * s);
  });
}

template <typename T>
void ropeForward(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                 double theta, cudaStream_t stream, int64_t offset) {
  // (y1, y2) = (x1 cos - x2 sin, x2 cos + x1 sin), angle (offset + t) theta^(-2j/d)
  rotateHalves(y, x, seq, batch, heads, headDim, theta, 1.0, offset, stream, "ropeForward");
}

template <typename T>
void ropeBackward(T *dx, const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                  double theta, cudaStream_t stream, int64_t offset) {
  // (dx1, dx2) = (dy1 cos + dy2 sin, dy2 cos - dy1 sin)
  rotateHalves(dx, dy, seq, batch, heads, headDim, theta, -1.0, offset, stream, "ropeBackward");
}

template <typename T> void fill(T *y, int64_t n, float value, cudaStream_t stream) {
  // y = value; all-zero bits are +0 in every type, which a memset writes fastest
  if (n <= 0)
    return;
  if (value == 0.0f && !std::signbit(value)) {
    PARC_CUDA_CHECK(cudaMemsetAsync(y, 0, n * sizeof(T), stream), "fill");
    return;
  }
  forEach(n, stream, "fill", [=] __device__(int64_t e) { y[e] = fromFloat<T>(value); });
}

template void fill(float *, int64_t, float, cudaStream_t);
template void fill(double *, int64_t, float, cudaStream_t);
template void fill(__nv_bfloat16 *, int64_t, float, cudaStream_t);
template void fill(__half *, int64_t, float, cudaStream_t);

#define PARC_INSTANTIATE(T)                                                                        \
  template void embeddingForward(T *, const int64_t *, const T *, int64_t, int64_t, int64_t,       \
                                 int64_t, int64_t, cudaStream_t);                                  \
  template void embeddingBackward(T *, const int64_t *, const T *, int64_t, int64_t, int64_t,      \
                                  int64_t, int64_t, cudaStream_t);                                 \
  template void positionEmbeddingForward(T *, const T *, const T *, int64_t, int64_t, int64_t,     \
                                         cudaStream_t);                                            \
  template void positionEmbeddingBackward(T *, T *, const T *, int64_t, int64_t, int64_t,          \
                                          cudaStream_t);                                           \
  template void biasAddForward(T *, const T *, const T *, int64_t, int64_t, cudaStream_t);         \
  template void biasAddBackward(T *, T *, const T *, int64_t, int64_t, cudaStream_t);              \
  template void residualAddForward(T *, const T *, const T *, int64_t, cudaStream_t);              \
  template void residualAddBackward(T *, T *, const T *, int64_t, cudaStream_t);                   \
  template void geluForward(T *, const T *, int64_t, cudaStream_t);                                \
  template void geluBackward(T *, const T *, const T *, int64_t, cudaStream_t);                    \
  template void biasGeluForward(T *, const T *, const T *, int64_t, int64_t, cudaStream_t);        \
  template void biasGeluBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t,      \
                                 cudaStream_t);                                                    \
  template void swigluForward(T *, const T *, const T *, int64_t, int64_t, cudaStream_t);          \
  template void swigluBackward(T *, T *, const T *, const T *, const T *, int64_t, int64_t,        \
                               cudaStream_t);                                                      \
  template void ropeForward(T *, const T *, int64_t, int64_t, int64_t, int64_t, double,            \
                            cudaStream_t, int64_t);                                                \
  template void ropeBackward(T *, const T *, int64_t, int64_t, int64_t, int64_t, double,           \
                             cudaStream_t, int64_t);
PARC_CUDA_FOR_STORAGE_TYPES(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cuda
