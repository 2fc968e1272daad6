//===- CudaFlashAttention.h - Fused attention on tensor cores, no seq x seq buffer -===//
//
// The same math, layouts and gradient conventions as attentionForward/Backward of
// CudaKernels.h and Kernels.h (q, y, dq [seq, batch, heads*headDim]; k, v, dk, dv [seq, batch,
// kvHeads*headDim]; query head h reads key/value head h / (heads / kvHeads); scale
// 1/sqrt(headDim); optional causal mask), computed FlashAttention-2 style: scores and
// probabilities live in registers a tile at a time, so memory traffic is linear in seq.
//
// The storage type is bf16 or fp16; products run on tensor cores with fp32 accumulation, and
// the probabilities and their gradients are rounded to the storage type before they are
// multiplied, as the cuBLAS path rounds them. The backward gets no statistics from the forward
// (the plan format passes only q, k, v and dy), so it recomputes them in a first pass; every
// sum has a fixed order and nothing uses atomics, so results are bitwise reproducible.
//
// Shapes outside flashAttentionSupports(), heads not a multiple of kvHeads, or pointers not
// 16-byte aligned are rejected with a CudaError before anything is launched.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CUDAFLASHATTENTION_H
#define PARC_RUNTIME_CUDAFLASHATTENTION_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace parc::runtime::cuda {

/// True for what the fused kernels handle: seq a positive multiple of 64 (no tail tiles; at
/// most 64 * 65535) and headDim 64 or 128. Callers fall back to attentionForward/Backward of
/// CudaKernels.h otherwise.
bool flashAttentionSupports(int64_t seq, int64_t headDim);

/// y = softmax(q k^T / sqrt(headDim) [+ causal mask]) v per (batch, query head).
template <typename T>
void flashAttentionForward(T *y, const T *q, const T *k, const T *v, int64_t seq, int64_t batch,
                           int64_t heads, int64_t kvHeads, int64_t headDim, bool causal,
                           cudaStream_t stream);

/// dq, dk, dv of the forward above, all three overwritten; dk and dv sum over the query heads
/// that share a key/value head. Allocates 8 * batch * heads * seq bytes of stream-ordered
/// scratch for the recomputed row statistics.
template <typename T>
void flashAttentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *dy,
                            int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads,
                            int64_t headDim, bool causal, cudaStream_t stream);

} // namespace parc::runtime::cuda

#endif // PARC_RUNTIME_CUDAFLASHATTENTION_H
