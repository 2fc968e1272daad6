//===- Common.cuh - What the CUDA kernels share: conversions, reductions --===//
//
// Private to runtime/kernels/cuda. Values are loaded into fp32 (or fp64) registers, computed
// there and rounded to the storage type once, so the three storage types share one kernel
// body. Block reductions combine in a fixed tree over a fixed block size, so results do not
// depend on timing.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CUDA_COMMON_CUH
#define PARC_RUNTIME_KERNELS_CUDA_COMMON_CUH

#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaKernels.h"
#include "parc/Runtime/CudaStreamBuffer.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

namespace parc::runtime::cuda::detail {

/// Threads per block of every kernel; the block reductions assume a multiple of 32.
constexpr int kBlock = 256;
/// Enough blocks of kBlock threads to keep any current GPU busy; grid-stride loops do the rest.
constexpr int64_t kMaxBlocks = 4096;

inline unsigned blocksFor(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kBlock - 1) / kBlock, 1, kMaxBlocks));
}

/// Reports a failed launch (bad configuration, no kernel image for the device) at once.
inline void checkLaunch(const char *kernel) { PARC_CUDA_CHECK(cudaGetLastError(), kernel); }

__device__ __forceinline__ float toFloat(float x) { return x; }
__device__ __forceinline__ float toFloat(double x) { return static_cast<float>(x); }
__device__ __forceinline__ float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float toFloat(__half x) { return __half2float(x); }

__device__ __forceinline__ double toDouble(float x) { return x; }
__device__ __forceinline__ double toDouble(double x) { return x; }
__device__ __forceinline__ double toDouble(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double toDouble(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T fromFloat(float x);
template <> __device__ __forceinline__ float fromFloat<float>(float x) { return x; }
template <> __device__ __forceinline__ double fromFloat<double>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <> __device__ __forceinline__ __half fromFloat<__half>(float x) { return __float2half(x); }

template <typename T> __device__ __forceinline__ T fromDouble(double x);
template <> __device__ __forceinline__ float fromDouble<float>(double x) {
  return static_cast<float>(x);
}
template <> __device__ __forceinline__ double fromDouble<double>(double x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 fromDouble<__nv_bfloat16>(double x) {
  return __double2bfloat16(x);
}
template <> __device__ __forceinline__ __half fromDouble<__half>(double x) {
  return __double2half(x);
}

struct SumOp {
  template <typename V> __device__ __forceinline__ V operator()(V a, V b) const { return a + b; }
};
struct MaxOp {
  template <typename V> __device__ __forceinline__ V operator()(V a, V b) const {
    return a > b ? a : b;
  }
};

template <typename V, typename Op> __device__ __forceinline__ V warpReduce(V value, Op op) {
  for (int offset = 16; offset > 0; offset /= 2)
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

/// Every thread of the block gets op over all threads' values. Each warp folds the warps'
/// partials itself, so no broadcast step is needed; the leading barrier lets callers reduce
/// twice in a row.
template <typename V, typename Op>
__device__ __forceinline__ V blockReduce(V value, Op op, V identity) {
  __shared__ V partial[32];
  value = warpReduce(value, op);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0)
    partial[warp] = value;
  __syncthreads();
  int warps = (blockDim.x + 31) / 32;
  return warpReduce(lane < warps ? partial[lane] : identity, op);
}

template <typename F> __global__ void forEachKernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    f(i);
}

/// Runs f(i) for every i in [0, n) on `stream`; f is a __device__ lambda.
template <typename F> void forEach(int64_t n, cudaStream_t stream, const char *kernel, F f) {
  if (n <= 0)
    return;
  forEachKernel<<<blocksFor(n), kBlock, 0, stream>>>(n, f);
  checkLaunch(kernel);
}

/// Rows per chunk of a column sum: chunk c covers rows [c * rowsPerChunk, ...), and stage 2
/// adds the chunks' partial sums in chunk order, so the result depends on rows and dim only.
inline int64_t columnSumChunks(int64_t rows) { return std::clamp<int64_t>(rows / 64, 1, 128); }

constexpr int kColumnTile = 32, kColumnRows = 8;

// partial[c, i] = sum over chunk c's rows r of value(r, i), in a fixed order.
template <typename F>
__global__ void columnPartialKernel(float *partial, int64_t rows, int64_t dim, int64_t rowsPerChunk,
                                    F value) {
  __shared__ float tile[kColumnRows][kColumnTile];
  int64_t i = blockIdx.x * int64_t(kColumnTile) + threadIdx.x, chunk = blockIdx.y;
  int64_t end = std::min(rows, (chunk + 1) * rowsPerChunk);
  float sum = 0;
  if (i < dim)
    for (int64_t r = chunk * rowsPerChunk + threadIdx.y; r < end; r += kColumnRows)
      sum += value(r, i);
  tile[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && i < dim) {
    for (int y = 1; y < kColumnRows; ++y)
      sum += tile[y][threadIdx.x];
    partial[chunk * dim + i] = sum;
  }
}

// out[i] += sum_c partial[c, i]
template <typename T>
__global__ void columnFinishKernel(T *out, const float *partial, int64_t chunks, int64_t dim) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < dim;
       i += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0;
    for (int64_t c = 0; c < chunks; ++c)
      sum += partial[c * dim + i];
    out[i] = fromFloat<T>(toFloat(out[i]) + sum);
  }
}

/// out[i] += sum_r value(r, i) over r < rows, for i < dim: a parameter gradient's sum over
/// rows, deterministic (two passes through an fp32 scratch of columnSumChunks(rows) rows).
template <typename T, typename F>
void columnSumAdd(T *out, int64_t rows, int64_t dim, cudaStream_t stream, const char *kernel,
                  F value) {
  if (rows <= 0 || dim <= 0)
    return;
  int64_t chunks = columnSumChunks(rows), rowsPerChunk = (rows + chunks - 1) / chunks;
  StreamBuffer<float> partial(chunks * dim, stream, kernel);
  dim3 grid(static_cast<unsigned>((dim + kColumnTile - 1) / kColumnTile),
            static_cast<unsigned>(chunks));
  columnPartialKernel<<<grid, dim3(kColumnTile, kColumnRows), 0, stream>>>(partial.get(), rows, dim,
                                                                           rowsPerChunk, value);
  checkLaunch(kernel);
  columnFinishKernel<<<blocksFor(dim), kBlock, 0, stream>>>(out, partial.get(), chunks, dim);
  checkLaunch(kernel);
}

} // namespace parc::runtime::cuda::detail

/// Explicit instantiations for the three storage types.
#define PARC_CUDA_FOR_STORAGE_TYPES(MACRO) MACRO(float) MACRO(__nv_bfloat16) MACRO(__half)

#endif
