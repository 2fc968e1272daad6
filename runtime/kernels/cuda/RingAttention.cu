//===- RingAttention.cu - blockwise attention, merge and block backward ---===//
//
// The device twins of cpu/RingAttention.cpp. Ring attention's blocks are short (seq / (2 cp)
// queries and keys), so each thread owns one query row (one key row for dK and dV) and walks
// the other side of the block with an online softmax, accumulating in fp32 in registers: no
// atomics and no reduction order that depends on timing, so every run gives the same bits.
//
//===----------------------------------------------------------------------===//

#include "Common.cuh"

#include "parc/Runtime/CudaKernels.h"

#include <cmath>

namespace parc::runtime::cuda {

using namespace detail;

namespace {

/// The largest head the per-thread accumulators hold.
constexpr int64_t kMaxHeadDim = 256;

void checkHeadDim(int64_t headDim, const char *kernel) {
  if (headDim > kMaxHeadDim)
    throwCallFailed(kernel, "argument check", "ring attention's blocks take heads of at most 256",
                    __FILE__, __LINE__);
}

/// Where the rows of one (batch, query head) of a block live.
struct Rows {
  int64_t batch, heads, kvHeads, headDim;

  __device__ int64_t q(int64_t t, int64_t b, int64_t h) const {
    return ((t * batch + b) * heads + h) * headDim;
  }
  __device__ int64_t kv(int64_t u, int64_t b, int64_t h) const {
    return ((u * batch + b) * kvHeads + h / (heads / kvHeads)) * headDim;
  }
  __device__ int64_t lse(int64_t t, int64_t b, int64_t h, int64_t seqQ) const {
    return (b * heads + h) * seqQ + t;
  }
};

template <typename T>
__device__ float dot(const T *a, const T *b, int64_t n) {
  float sum = 0;
  for (int64_t d = 0; d < n; ++d)
    sum += toFloat(a[d]) * toFloat(b[d]);
  return sum;
}

} // namespace

template <typename T>
void attentionBlockForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seqQ,
                           int64_t seqK, int64_t batch, int64_t heads, int64_t kvHeads,
                           int64_t headDim, bool causal, cudaStream_t stream) {
  // online softmax over the row's keys: y = sum_u e^(s_u - lse) v_u, lse = log sum_u e^s_u
  checkHeadDim(headDim, "attentionBlockForward");
  Rows rows{batch, heads, kvHeads, headDim};
  float scale = 1.0f / std::sqrt(float(headDim));
  forEach(seqQ * batch * heads, stream, "attentionBlockForward", [=] __device__(int64_t e) {
    int64_t t = e / (batch * heads), b = e / heads % batch, h = e % heads;
    const T *qRow = q + rows.q(t, b, h);
    float acc[kMaxHeadDim];
    for (int64_t d = 0; d < headDim; ++d)
      acc[d] = 0;
    float max = -INFINITY, sum = 0;
    for (int64_t u = 0, visible = causal ? t + 1 : seqK; u < visible; ++u) {
      const T *kRow = k + rows.kv(u, b, h), *vRow = v + rows.kv(u, b, h);
      float s = scale * dot(qRow, kRow, headDim);
      if (s > max) {
        float shrink = expf(max - s);
        for (int64_t d = 0; d < headDim; ++d)
          acc[d] *= shrink;
        sum *= shrink;
        max = s;
      }
      float p = expf(s - max);
      sum += p;
      for (int64_t d = 0; d < headDim; ++d)
        acc[d] += p * toFloat(vRow[d]);
    }
    T *yRow = y + rows.q(t, b, h);
    for (int64_t d = 0; d < headDim; ++d)
      yRow[d] = fromFloat<T>(acc[d] / sum);
    lse[rows.lse(t, b, h, seqQ)] = fromFloat<T>(max + logf(sum));
  });
}

template <typename T>
void attentionMerge(T *y, T *lse, const T *y1, const T *lse1, const T *y2, const T *lse2,
                    int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                    cudaStream_t stream) {
  // lse = log(e^lse1 + e^lse2), y = e^(lse1 - lse) y1 + e^(lse2 - lse) y2
  Rows rows{batch, heads, heads, headDim};
  forEach(seq * batch * heads, stream, "attentionMerge", [=] __device__(int64_t e) {
    int64_t t = e / (batch * heads), b = e / heads % batch, h = e % heads;
    int64_t row = rows.lse(t, b, h, seq), at = rows.q(t, b, h);
    float a = toFloat(lse1[row]), c = toFloat(lse2[row]), top = fmaxf(a, c);
    float merged = top + logf(expf(a - top) + expf(c - top));
    float wa = expf(a - merged), wc = expf(c - merged);
    for (int64_t d = 0; d < headDim; ++d)
      y[at + d] = fromFloat<T>(wa * toFloat(y1[at + d]) + wc * toFloat(y2[at + d]));
    lse[row] = fromFloat<T>(merged);
  });
}

template <typename T>
void attentionBlockBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                            const T *lse, const T *dy, int64_t seqQ, int64_t seqK, int64_t batch,
                            int64_t heads, int64_t kvHeads, int64_t headDim, bool causal,
                            cudaStream_t stream) {
  // P = e^(s q k^T - lse), dS = P (dy v^T - rowsum(dy * y)); dq = s dS k, dk = s dS^T q,
  // dv = P^T dy, the last two summed over the query heads of a key/value head
  checkHeadDim(headDim, "attentionBlockBackward");
  Rows rows{batch, heads, kvHeads, headDim};
  float scale = 1.0f / std::sqrt(float(headDim));
  // The probability and score gradient of query row t against key row u.
  auto pair = [=] __device__(int64_t t, int64_t u, int64_t b, int64_t h, float &p, float &ds) {
    const T *qRow = q + rows.q(t, b, h), *dyRow = dy + rows.q(t, b, h), *yRow = y + rows.q(t, b, h);
    p = expf(scale * dot(qRow, k + rows.kv(u, b, h), headDim) - toFloat(lse[rows.lse(t, b, h, seqQ)]));
    ds = p * (dot(dyRow, v + rows.kv(u, b, h), headDim) - dot(dyRow, yRow, headDim));
  };
  forEach(seqQ * batch * heads, stream, "attentionBlockBackward", [=] __device__(int64_t e) {
    int64_t t = e / (batch * heads), b = e / heads % batch, h = e % heads;
    float acc[kMaxHeadDim];
    for (int64_t d = 0; d < headDim; ++d)
      acc[d] = 0;
    for (int64_t u = 0, visible = causal ? t + 1 : seqK; u < visible; ++u) {
      float p, ds;
      pair(t, u, b, h, p, ds);
      const T *kRow = k + rows.kv(u, b, h);
      for (int64_t d = 0; d < headDim; ++d)
        acc[d] += ds * toFloat(kRow[d]);
    }
    T *dqRow = dq + rows.q(t, b, h);
    for (int64_t d = 0; d < headDim; ++d)
      dqRow[d] = fromFloat<T>(scale * acc[d]);
  });
  int64_t group = heads / kvHeads;
  forEach(seqK * batch * kvHeads, stream, "attentionBlockBackward", [=] __device__(int64_t e) {
    int64_t u = e / (batch * kvHeads), b = e / kvHeads % batch, kvHead = e % kvHeads;
    float dkAcc[kMaxHeadDim], dvAcc[kMaxHeadDim];
    for (int64_t d = 0; d < headDim; ++d)
      dkAcc[d] = dvAcc[d] = 0;
    for (int64_t h = kvHead * group; h < (kvHead + 1) * group; ++h)
      for (int64_t t = causal ? u : 0; t < seqQ; ++t) {
        float p, ds;
        pair(t, u, b, h, p, ds);
        const T *qRow = q + rows.q(t, b, h), *dyRow = dy + rows.q(t, b, h);
        for (int64_t d = 0; d < headDim; ++d) {
          dkAcc[d] += ds * toFloat(qRow[d]);
          dvAcc[d] += p * toFloat(dyRow[d]);
        }
      }
    int64_t at = ((u * batch + b) * kvHeads + kvHead) * headDim;
    for (int64_t d = 0; d < headDim; ++d) {
      dk[at + d] = fromFloat<T>(scale * dkAcc[d]);
      dv[at + d] = fromFloat<T>(dvAcc[d]);
    }
  });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void attentionBlockForward(T *, T *, const T *, const T *, const T *, int64_t,         \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, bool,           \
                                      cudaStream_t);                                               \
  template void attentionMerge(T *, T *, const T *, const T *, const T *, const T *, int64_t,     \
                               int64_t, int64_t, int64_t, cudaStream_t);                           \
  template void attentionBlockBackward(T *, T *, T *, const T *, const T *, const T *, const T *, \
                                       const T *, const T *, int64_t, int64_t, int64_t, int64_t,  \
                                       int64_t, int64_t, bool, cudaStream_t);
PARC_CUDA_FOR_STORAGE_TYPES(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cuda
