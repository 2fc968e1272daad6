//===- RingAttention.cpp - blockwise attention, merge and block backward --===//
//
// Context parallelism computes a rank's attention one key/value block at a time as the blocks
// travel the cp ring (compiler/Lower/RingLowering.cpp). A block writes its normalised output
// and the logsumexp of its rows; attention_merge combines two blocks of the same queries; and
// a block's backward needs only the merged output and logsumexp (Dao 2023, FlashAttention-2):
// the probabilities are exp(S - lse) and rowsum(P * dP) = rowsum(dy * y). As in Attention.cpp,
// one (batch, head) slice is a matrix with row stride batch*heads*headDim, multiplied in place.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Blas.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

namespace parc::runtime::cpu {

using detail::gemm;

namespace {

/// One (batch, query head) of a block: where its q, k/v rows and lse row start, and the row
/// strides of q and k/v.
struct BlockSlice {
  int64_t q, kv, lse, qStride, kvStride;
};

BlockSlice blockSlice(int64_t b, int64_t h, int64_t seqQ, int64_t batch, int64_t heads,
                      int64_t kvHeads, int64_t headDim) {
  assert(kvHeads > 0 && heads % kvHeads == 0 && "kv_heads must divide heads");
  int64_t kvHead = h / (heads / kvHeads);
  return {(b * heads + h) * headDim, (b * kvHeads + kvHead) * headDim, (b * heads + h) * seqQ,
          batch * heads * headDim, batch * kvHeads * headDim};
}

/// Keys row t of a block sees: all, or those up to t on the diagonal block.
int64_t visibleKeys(int64_t t, int64_t seqK, bool causal) { return causal ? t + 1 : seqK; }

/// scores [seqQ, seqK] = s q k^T of one slice.
template <typename T>
void blockScores(T *scores, const T *q, const T *k, const BlockSlice &s, int64_t seqQ,
                 int64_t seqK, int64_t headDim) {
  T scale = T(1.0 / std::sqrt(double(headDim)));
  gemm(false, true, seqQ, seqK, headDim, scale, q + s.q, s.qStride, k + s.kv, s.kvStride, T(0),
       scores, seqK);
}

} // namespace

template <typename T>
void attentionBlockForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seqQ,
                           int64_t seqK, int64_t batch, int64_t heads, int64_t kvHeads,
                           int64_t headDim, bool causal) {
  // P = exp(S - lse) row by row, lse = max + log sum exp(S - max); y = P v
  assert((!causal || seqQ == seqK) && "a causal block is a diagonal block");
  std::vector<T> probs(seqQ * seqK);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      BlockSlice s = blockSlice(b, h, seqQ, batch, heads, kvHeads, headDim);
      blockScores(probs.data(), q, k, s, seqQ, seqK, headDim);
      for (int64_t t = 0; t < seqQ; ++t) {
        T *row = probs.data() + t * seqK;
        int64_t valid = visibleKeys(t, seqK, causal);
        double max = *std::max_element(row, row + valid), sum = 0;
        for (int64_t u = 0; u < valid; ++u)
          sum += std::exp(double(row[u]) - max);
        double rowLse = max + std::log(sum);
        for (int64_t u = 0; u < valid; ++u)
          row[u] = T(std::exp(double(row[u]) - rowLse));
        std::fill(row + valid, row + seqK, T(0));
        lse[s.lse + t] = T(rowLse);
      }
      gemm(false, false, seqQ, headDim, seqK, T(1), probs.data(), seqK, v + s.kv, s.kvStride,
           T(0), y + s.q, s.qStride);
    }
}

template <typename T>
void attentionMerge(T *y, T *lse, const T *y1, const T *lse1, const T *y2, const T *lse2,
                    int64_t seq, int64_t batch, int64_t heads, int64_t headDim) {
  // lse = log(e^lse1 + e^lse2), y = e^(lse1 - lse) y1 + e^(lse2 - lse) y2
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
      int64_t row = bh * seq + t, at = (t * batch * heads + bh) * headDim;
      double a = lse1[row], c = lse2[row], top = std::max(a, c);
      double merged = top + std::log(std::exp(a - top) + std::exp(c - top));
      double wa = std::exp(a - merged), wc = std::exp(c - merged);
      for (int64_t d = 0; d < headDim; ++d)
        y[at + d] = T(wa * y1[at + d] + wc * y2[at + d]);
      lse[row] = T(merged);
    }
}

template <typename T>
void attentionBlockBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                            const T *lse, const T *dy, int64_t seqQ, int64_t seqK, int64_t batch,
                            int64_t heads, int64_t kvHeads, int64_t headDim, bool causal) {
  // dv += P^T dy; dS = P (dy v^T - rowsum(dy * y)); dq = s dS k; dk += s dS^T q
  assert((!causal || seqQ == seqK) && "a causal block is a diagonal block");
  T scale = T(1.0 / std::sqrt(double(headDim)));
  std::fill(dk, dk + seqK * batch * kvHeads * headDim, T(0));
  std::fill(dv, dv + seqK * batch * kvHeads * headDim, T(0));
  std::vector<T> probs(seqQ * seqK), dscores(seqQ * seqK);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      BlockSlice s = blockSlice(b, h, seqQ, batch, heads, kvHeads, headDim);
      blockScores(probs.data(), q, k, s, seqQ, seqK, headDim);
      for (int64_t t = 0; t < seqQ; ++t) {
        T *row = probs.data() + t * seqK;
        int64_t valid = visibleKeys(t, seqK, causal);
        for (int64_t u = 0; u < valid; ++u)
          row[u] = T(std::exp(double(row[u]) - double(lse[s.lse + t])));
        std::fill(row + valid, row + seqK, T(0));
      }
      // Query heads of one group share k and v, so their dk and dv add up (beta = 1).
      gemm(true, false, seqK, headDim, seqQ, T(1), probs.data(), seqK, dy + s.q, s.qStride, T(1),
           dv + s.kv, s.kvStride);
      gemm(false, true, seqQ, seqK, headDim, T(1), dy + s.q, s.qStride, v + s.kv, s.kvStride,
           T(0), dscores.data(), seqK);
      for (int64_t t = 0; t < seqQ; ++t) {
        const T *dyRow = dy + s.q + t * s.qStride, *yRow = y + s.q + t * s.qStride;
        double dot = 0;
        for (int64_t d = 0; d < headDim; ++d)
          dot += double(dyRow[d]) * yRow[d];
        const T *p = probs.data() + t * seqK;
        T *ds = dscores.data() + t * seqK;
        for (int64_t u = 0; u < seqK; ++u)
          ds[u] = T(p[u] * (ds[u] - dot));
      }
      gemm(false, false, seqQ, headDim, seqK, scale, dscores.data(), seqK, k + s.kv, s.kvStride,
           T(0), dq + s.q, s.qStride);
      gemm(true, false, seqK, headDim, seqQ, scale, dscores.data(), seqK, q + s.q, s.qStride,
           T(1), dk + s.kv, s.kvStride);
    }
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void attentionBlockForward(T *, T *, const T *, const T *, const T *, int64_t,         \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, bool);          \
  template void attentionMerge(T *, T *, const T *, const T *, const T *, const T *, int64_t,     \
                               int64_t, int64_t, int64_t);                                         \
  template void attentionBlockBackward(T *, T *, T *, const T *, const T *, const T *, const T *, \
                                       const T *, const T *, int64_t, int64_t, int64_t, int64_t,  \
                                       int64_t, int64_t, bool);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
