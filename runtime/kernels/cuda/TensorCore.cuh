//===- TensorCore.cuh - Warp-level tensor-core products for fused kernels -===//
//
// The PTX the fused kernels build on (asynchronous 16-byte copies, ldmatrix, mma.sync on
// bf16/fp16 with fp32 accumulators) and the per-warp products, fragment conversions and
// stores made of them. A warp owns 16 rows; accumulators are in mma's m16n8 layout (lane
// l holds rows l/4 and l/4 + 8, columns 2*(l%4) and 2*(l%4) + 1 of each 8-column slice).
// Private to runtime/kernels/cuda.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CUDA_TENSORCORE_CUH
#define PARC_RUNTIME_KERNELS_CUDA_TENSORCORE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace parc::runtime::cuda::tensorcore {

//===----------------------------------------------------------------------===//
// PTX: asynchronous copies, ldmatrix, mma
//===----------------------------------------------------------------------===//

__device__ __forceinline__ unsigned sharedAddress(const void *pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void copyAsync16(void *shared, const void *global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sharedAddress(shared)),
               "l"(global)
               : "memory");
}
__device__ __forceinline__ void commitCopies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/// Waits until at most `Pending` of this thread's committed copy groups are in flight.
template <int Pending> __device__ __forceinline__ void waitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

/// Four 8x8 b16 matrices: lanes 8i to 8i + 7 give the addresses of the rows of matrix i, and
/// r[i] of a lane holds row lane/4, columns 2(lane%4) and +1 of matrix i, or of its transpose.
template <bool Transpose>
__device__ __forceinline__ void loadMatrices(uint32_t (&r)[4], const void *row) {
  if constexpr (Transpose)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(row)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(row)));
}

/// c (16 x 8) += a (16 x 16) b (16 x 8), fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats rounded to T, `low` in the low half as operands expect.
template <typename T> __device__ __forceinline__ uint32_t pack(float low, float high) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    memcpy(&bits, &pair, sizeof bits);
  } else {
    __half2 pair = __floats2half2_rn(low, high);
    memcpy(&bits, &pair, sizeof bits);
  }
  return bits;
}

//===----------------------------------------------------------------------===//
// Warp tiles
//===----------------------------------------------------------------------===//

/// Calls f(n, e, row, column) for every element c[n][e] of a warp's 16 x N accumulator
/// tiles, row in [0, 16) and column in [0, N). Unrolled, so n and e index register arrays;
/// e / 2 tells row g (0) from row g + 8 (1).
template <int N, typename F> __device__ __forceinline__ void forEachElement(F f) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      f(n, e, lane / 4 + 8 * (e / 2), 8 * n + 2 * (lane % 4) + e % 2);
}

/// acc (16 x N) += A B^T: A the 16 rows at `a`, B the N rows at `b`, both K wide and
/// `stride` elements a row in shared memory.
template <typename T, int N, int K>
__device__ __forceinline__ void warpProductABt(float (&acc)[N / 8][4], const T *a, const T *b,
                                               int stride) {
  static_assert(N % 16 == 0 && K % 16 == 0);
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    // Matrices: rows 0-7 and 8-15 at column k, then the same at k + 8: a[0..3].
    uint32_t fragA[4];
    loadMatrices<false>(fragA, a + (lane % 16) * stride + k + (lane / 16) * 8);
#pragma unroll
    for (int n = 0; n < N; n += 16) {
      // Matrices: B rows n..n+7 at columns k and k + 8 (b0, b1 of tile n), then rows n+8..
      uint32_t fragB[4];
      loadMatrices<false>(fragB,
                          b + (n + (lane / 16) * 8 + lane % 8) * stride + k + ((lane / 8) % 2) * 8);
      mma<T>(acc[n / 8], fragA, fragB[0], fragB[1]);
      mma<T>(acc[n / 8 + 1], fragA, fragB[2], fragB[3]);
    }
  }
}

/// acc (16 x N) += A B: A in registers (toFragments), B the K rows at `b`, N wide, in shared
/// memory; ldmatrix transposes B on the way.
template <typename T, int N, int K>
__device__ __forceinline__ void
warpProductAB(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4], const T *b, int stride) {
  static_assert(N % 16 == 0 && K % 16 == 0);
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < K; k += 16)
#pragma unroll
    for (int n = 0; n < N; n += 16) {
      // Matrices: B rows k..k+7 and k+8..k+15 at column n (b0, b1 of tile n), then column n+8.
      uint32_t fragB[4];
      loadMatrices<true>(fragB,
                         b + (k + ((lane / 8) % 2) * 8 + lane % 8) * stride + n + (lane / 16) * 8);
      mma<T>(acc[n / 8], a[k / 16], fragB[0], fragB[1]);
      mma<T>(acc[n / 8 + 1], a[k / 16], fragB[2], fragB[3]);
    }
}

/// The 16 x K accumulator tiles c, rounded to T, as A operands over K.
template <typename T, int K>
__device__ __forceinline__ void toFragments(uint32_t (&a)[K / 16][4], const float (&c)[K / 8][4]) {
#pragma unroll
  for (int k = 0; k < K / 16; ++k) {
    a[k][0] = pack<T>(c[2 * k][0], c[2 * k][1]);
    a[k][1] = pack<T>(c[2 * k][2], c[2 * k][3]);
    a[k][2] = pack<T>(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[k][3] = pack<T>(c[2 * k + 1][2], c[2 * k + 1][3]);
  }
}

/// Writes a warp's 16 x N accumulators times factor[row half], rounded to T, to the 16 rows
/// at `tile`.
template <typename T, int N>
__device__ __forceinline__ void storeFragments(T *tile, int stride, const float (&c)[N / 8][4],
                                               const float (&factor)[2]) {
  int lane = threadIdx.x % 32, row = lane / 4, column = 2 * (lane % 4);
#pragma unroll
  for (int n = 0; n < N / 8; ++n) {
    *reinterpret_cast<uint32_t *>(tile + row * stride + 8 * n + column) =
        pack<T>(c[n][0] * factor[0], c[n][1] * factor[0]);
    *reinterpret_cast<uint32_t *>(tile + (row + 8) * stride + 8 * n + column) =
        pack<T>(c[n][2] * factor[1], c[n][3] * factor[1]);
  }
}
} // namespace parc::runtime::cuda::tensorcore

#endif // PARC_RUNTIME_KERNELS_CUDA_TENSORCORE_CUH
