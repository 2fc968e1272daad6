//===- FlashAttention.cpp - Attention that keeps only the row logsumexp ---===//
//
// The CPU twin of FlashAttention (Dao et al. 2022, FlashAttention-2's loop order): queries and
// keys are taken a tile of kTile rows at a time, the scores of one tile pair exist only in a
// kTile x kTile scratch, and the softmax is accumulated online (running max and sum, rescaling
// the partial output). The forward keeps lse = max + log(sum) of every query row
// ([batch, heads, seq]); the backward recomputes each tile's probabilities from it, P =
// exp(S - lse), and uses D = rowsum(dy * y) for the softmax gradient, so nothing seq x seq
// outlives a tile. Same layouts and grouped-query convention as Attention.cpp; equal to the
// standard kernels up to the order of the roundings.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "AttentionSlices.h"
#include "Blas.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace parc::runtime::cpu {

using detail::gemm;
using detail::HeadSlices;
using detail::headSlices;

namespace {

constexpr int64_t kTile = 64;

/// One query tile against the key tiles it sees: rows [q0, q0 + rows), keys [0, keyEnd).
struct QueryTile {
  int64_t q0, rows, keyEnd;
};

QueryTile queryTile(int64_t q0, int64_t seq, bool causal) {
  int64_t rows = std::min(kTile, seq - q0);
  return {q0, rows, causal ? q0 + rows : seq};
}

/// Keys of tile [k0, k0 + cols) that query row t may read.
int64_t visibleKeys(int64_t t, int64_t k0, int64_t cols, bool causal) {
  return causal ? std::clamp<int64_t>(t - k0 + 1, 0, cols) : cols;
}

} // namespace

template <typename T>
void flashAttentionForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seq,
                           int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim,
                           bool causal) {
  // y = softmax(s q k^T + mask) v a tile at a time; lse = m + log(l) per query row
  T scale = T(1.0 / std::sqrt(double(headDim)));
  std::vector<T> scores(size_t(kTile * kTile)), acc(size_t(kTile * headDim));
  std::vector<double> rowMax(static_cast<size_t>(kTile)), rowSum(static_cast<size_t>(kTile));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      HeadSlices s = headSlices(b, h, batch, heads, kvHeads, headDim);
      T *rowLse = lse + (b * heads + h) * seq;
      for (int64_t q0 = 0; q0 < seq; q0 += kTile) {
        QueryTile tile = queryTile(q0, seq, causal);
        std::fill(rowMax.begin(), rowMax.end(), -std::numeric_limits<double>::infinity());
        std::fill(rowSum.begin(), rowSum.end(), 0.0);
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t k0 = 0; k0 < tile.keyEnd; k0 += kTile) {
          int64_t cols = std::min(kTile, tile.keyEnd - k0);
          gemm(false, true, tile.rows, cols, headDim, scale, q + s.qOffset + q0 * s.qStride,
               s.qStride, k + s.kvOffset + k0 * s.kvStride, s.kvStride, T(0), scores.data(),
               cols);
          for (int64_t r = 0; r < tile.rows; ++r) {
            T *row = scores.data() + r * cols;
            int64_t valid = visibleKeys(q0 + r, k0, cols, causal);
            double tileMax = -std::numeric_limits<double>::infinity();
            for (int64_t u = 0; u < valid; ++u)
              tileMax = std::max(tileMax, double(row[u]));
            double newMax = std::max(rowMax[size_t(r)], tileMax);
            // A row that sees no key of this tile keeps its state: its scale is 1.
            double rescale = valid == 0 ? 1.0 : std::exp(rowMax[size_t(r)] - newMax);
            double sum = 0;
            for (int64_t u = 0; u < cols; ++u) {
              row[u] = u < valid ? T(std::exp(double(row[u]) - newMax)) : T(0);
              sum += row[u];
            }
            if (valid > 0) {
              rowSum[size_t(r)] = rowSum[size_t(r)] * rescale + sum;
              rowMax[size_t(r)] = newMax;
              for (int64_t j = 0; j < headDim; ++j)
                acc[size_t(r * headDim + j)] *= T(rescale);
            }
          }
          gemm(false, false, tile.rows, headDim, cols, T(1), scores.data(), cols,
               v + s.kvOffset + k0 * s.kvStride, s.kvStride, T(1), acc.data(), headDim);
        }
        for (int64_t r = 0; r < tile.rows; ++r) {
          T *out = y + s.qOffset + (q0 + r) * s.qStride;
          for (int64_t j = 0; j < headDim; ++j)
            out[j] = T(acc[size_t(r * headDim + j)] / rowSum[size_t(r)]);
          rowLse[q0 + r] = T(rowMax[size_t(r)] + std::log(rowSum[size_t(r)]));
        }
      }
    }
}

template <typename T>
void flashAttentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                            const T *lse, const T *dy, int64_t seq, int64_t batch, int64_t heads,
                            int64_t kvHeads, int64_t headDim, bool causal) {
  // P = exp(s q k^T - lse); dv += P^T dy; dS = P (dy v^T - D), D = rowsum(dy y);
  // dq += s dS k; dk += s dS^T q
  T scale = T(1.0 / std::sqrt(double(headDim)));
  std::fill(dq, dq + seq * batch * heads * headDim, T(0));
  std::fill(dk, dk + seq * batch * kvHeads * headDim, T(0));
  std::fill(dv, dv + seq * batch * kvHeads * headDim, T(0));
  std::vector<T> probs(size_t(kTile * kTile)), dscores(size_t(kTile * kTile));
  std::vector<double> delta(static_cast<size_t>(seq));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      HeadSlices s = headSlices(b, h, batch, heads, kvHeads, headDim);
      const T *rowLse = lse + (b * heads + h) * seq;
      for (int64_t t = 0; t < seq; ++t) {
        const T *dyRow = dy + s.qOffset + t * s.qStride, *yRow = y + s.qOffset + t * s.qStride;
        double dot = 0;
        for (int64_t j = 0; j < headDim; ++j)
          dot += double(dyRow[j]) * yRow[j];
        delta[size_t(t)] = dot;
      }
      for (int64_t q0 = 0; q0 < seq; q0 += kTile) {
        QueryTile tile = queryTile(q0, seq, causal);
        const T *qTile = q + s.qOffset + q0 * s.qStride, *dyTile = dy + s.qOffset + q0 * s.qStride;
        for (int64_t k0 = 0; k0 < tile.keyEnd; k0 += kTile) {
          int64_t cols = std::min(kTile, tile.keyEnd - k0);
          const T *kTileRows = k + s.kvOffset + k0 * s.kvStride;
          const T *vTileRows = v + s.kvOffset + k0 * s.kvStride;
          gemm(false, true, tile.rows, cols, headDim, scale, qTile, s.qStride, kTileRows,
               s.kvStride, T(0), probs.data(), cols);
          for (int64_t r = 0; r < tile.rows; ++r) {
            int64_t valid = visibleKeys(q0 + r, k0, cols, causal);
            T *row = probs.data() + r * cols;
            for (int64_t u = 0; u < cols; ++u)
              row[u] = u < valid ? T(std::exp(double(row[u]) - double(rowLse[q0 + r]))) : T(0);
          }
          // Query heads of one group share k and v, so their dk and dv add up (beta = 1).
          gemm(true, false, cols, headDim, tile.rows, T(1), probs.data(), cols, dyTile, s.qStride,
               T(1), dv + s.kvOffset + k0 * s.kvStride, s.kvStride);
          gemm(false, true, tile.rows, cols, headDim, T(1), dyTile, s.qStride, vTileRows,
               s.kvStride, T(0), dscores.data(), cols);
          for (int64_t r = 0; r < tile.rows; ++r)
            for (int64_t u = 0; u < cols; ++u) {
              T &ds = dscores[size_t(r * cols + u)];
              ds = T(probs[size_t(r * cols + u)] * (double(ds) - delta[size_t(q0 + r)]));
            }
          gemm(false, false, tile.rows, headDim, cols, scale, dscores.data(), cols, kTileRows,
               s.kvStride, T(1), dq + s.qOffset + q0 * s.qStride, s.qStride);
          gemm(true, false, cols, headDim, tile.rows, scale, dscores.data(), cols, qTile,
               s.qStride, T(1), dk + s.kvOffset + k0 * s.kvStride, s.kvStride);
        }
      }
    }
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void flashAttentionForward(T *, T *, const T *, const T *, const T *, int64_t, int64_t, \
                                      int64_t, int64_t, int64_t, bool);                            \
  template void flashAttentionBackward(T *, T *, T *, const T *, const T *, const T *, const T *,  \
                                       const T *, const T *, int64_t, int64_t, int64_t, int64_t,   \
                                       int64_t, bool);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
