//===- FlashAttention.cpp - Attention that keeps only the row logsumexp ---===//
//
// The CPU twin of FlashAttention (Dao et al. 2022, FlashAttention-2's loop order): queries are
// taken a tile of kTile rows and keys a block of kKeyTile rows at a time, the scores of one pair
// exist only in a kTile x kKeyTile scratch, and the softmax is accumulated online (running max and
// sum, rescaling the partial output). The forward keeps lse = max + log(sum) of every query row
// ([batch, heads, seq]); the backward recomputes each tile's probabilities from it, P = exp(S -
// lse), and uses D = rowsum(dy * y) for the softmax gradient, so nothing seq x seq outlives a
// tile. Same layouts and grouped-query convention as Attention.cpp; equal to the standard kernels
// up to the order of the roundings. The (batch, head) slices run in parallel on the kernel
// threads, the backward by key/value head so that the query heads adding into one dk and dv share
// a thread; each slice is one thread's, so the bits do not depend on the thread count. In fp32 the
// exponentials are VecMath.h's, in vectorised loops.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "AttentionSlices.h"
#include "Blas.h"
#include "VecMath.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace parc::runtime::cpu {

using detail::gemmSerial;
using detail::HeadSlices;
using detail::headSlices;

namespace {

constexpr int64_t kTile = 64;
/// Keys per block: each GEMM is a call per block, and OpenBLAS runs one 64 x 256 x 64 GEMM
/// faster than four 64 x 64 x 64 ones (the scores, 64 KiB in fp32, stay in L2).
constexpr int64_t kKeyTile = 256;

/// One query tile against the key blocks it sees: rows [q0, q0 + rows), keys [0, keyEnd).
struct QueryTile {
  int64_t q0, rows, keyEnd;
};

QueryTile queryTile(int64_t q0, int64_t seq, bool causal) {
  int64_t rows = std::min(kTile, seq - q0);
  return {q0, rows, causal ? q0 + rows : seq};
}

/// Keys of block [k0, k0 + cols) that query row t may read.
int64_t visibleKeys(int64_t t, int64_t k0, int64_t cols, bool causal) {
  return causal ? std::clamp<int64_t>(t - k0 + 1, 0, cols) : cols;
}

/// row[u] = exp(row[u] - shift) for the `valid` first of `cols`, 0 after; returns their sum.
double expRow(double *row, double shift, int64_t valid, int64_t cols) {
  double sum = 0;
  for (int64_t u = 0; u < valid; ++u) {
    row[u] = std::exp(row[u] - shift);
    sum += row[u];
  }
  std::fill(row + valid, row + cols, 0.0);
  return sum;
}

PARC_VECTOR_CLONES double expRow(float *row, double shift, int64_t valid, int64_t cols) {
  float m = float(shift);
  float sum = detail::laneSum<float, 16>(valid, [&](int64_t u) {
    row[u] = detail::expf(row[u] - m);
    return row[u];
  });
  std::fill(row + valid, row + cols, 0.0f);
  return sum;
}

/// A thread's scratch of `size` elements, kept between calls (`which` tells buffers apart).
template <typename T> T *scratch(size_t size, int which) {
  thread_local std::vector<T> buffers[3];
  std::vector<T> &buffer = buffers[which];
  if (buffer.size() < size)
    buffer.resize(size);
  return buffer.data();
}

/// Zeroes `rows` rows of `width` elements `stride` apart.
template <typename T> void zeroRows(T *x, int64_t rows, int64_t width, int64_t stride) {
  for (int64_t t = 0; t < rows; ++t)
    std::fill_n(x + t * stride, width, T(0));
}

/// The forward of one (batch, head) slice: y and lse of its query rows.
template <typename T>
void flashForwardSlice(T *y, T *rowLse, const T *q, const T *k, const T *v, HeadSlices s,
                       int64_t seq, int64_t headDim, bool causal) {
  T scale = T(1.0 / std::sqrt(double(headDim)));
  T *scores = scratch<T>(size_t(kTile * kKeyTile), 0);
  T *acc = scratch<T>(size_t(kTile * headDim), 1);
  double rowMax[kTile], rowSum[kTile];
  for (int64_t q0 = 0; q0 < seq; q0 += kTile) {
    QueryTile tile = queryTile(q0, seq, causal);
    std::fill_n(rowMax, kTile, -std::numeric_limits<double>::infinity());
    std::fill_n(rowSum, kTile, 0.0);
    std::fill_n(acc, kTile * headDim, T(0));
    for (int64_t k0 = 0; k0 < tile.keyEnd; k0 += kKeyTile) {
      int64_t cols = std::min(kKeyTile, tile.keyEnd - k0);
      gemmSerial(false, true, tile.rows, cols, headDim, scale, q + s.qOffset + q0 * s.qStride,
                 s.qStride, k + s.kvOffset + k0 * s.kvStride, s.kvStride, T(0), scores, cols);
      for (int64_t r = 0; r < tile.rows; ++r) {
        T *row = scores + r * cols;
        int64_t valid = visibleKeys(q0 + r, k0, cols, causal);
        // A row that sees no key of this block keeps its state (its row of scores is zero).
        if (valid == 0) {
          std::fill_n(row, cols, T(0));
          continue;
        }
        double newMax = std::max(rowMax[r], double(*std::max_element(row, row + valid)));
        double rescale = std::exp(rowMax[r] - newMax);
        rowSum[r] = rowSum[r] * rescale + expRow(row, newMax, valid, cols);
        rowMax[r] = newMax;
        T factor = T(rescale);
#pragma omp simd
        for (int64_t j = 0; j < headDim; ++j)
          acc[r * headDim + j] *= factor;
      }
      gemmSerial(false, false, tile.rows, headDim, cols, T(1), scores, cols,
                 v + s.kvOffset + k0 * s.kvStride, s.kvStride, T(1), acc, headDim);
    }
    for (int64_t r = 0; r < tile.rows; ++r) {
      T *out = y + s.qOffset + (q0 + r) * s.qStride;
#pragma omp simd
      for (int64_t j = 0; j < headDim; ++j)
        out[j] = T(acc[r * headDim + j] / rowSum[r]);
      rowLse[q0 + r] = T(rowMax[r] + std::log(rowSum[r]));
    }
  }
}

/// The backward of one query head's slice, adding into dq, dk and dv (zeroed by the caller).
template <typename T>
void flashBackwardSlice(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                        const T *rowLse, const T *dy, HeadSlices s, int64_t seq, int64_t headDim,
                        bool causal) {
  T scale = T(1.0 / std::sqrt(double(headDim)));
  T *probs = scratch<T>(size_t(kTile * kKeyTile), 0);
  T *dscores = scratch<T>(size_t(kTile * kKeyTile), 1);
  T *delta = scratch<T>(size_t(seq), 2);
  for (int64_t t = 0; t < seq; ++t) {
    const T *dyRow = dy + s.qOffset + t * s.qStride, *yRow = y + s.qOffset + t * s.qStride;
    double dot = 0;
    for (int64_t j = 0; j < headDim; ++j)
      dot += double(dyRow[j]) * yRow[j];
    delta[t] = T(dot);
  }
  for (int64_t q0 = 0; q0 < seq; q0 += kTile) {
    QueryTile tile = queryTile(q0, seq, causal);
    const T *qTile = q + s.qOffset + q0 * s.qStride, *dyTile = dy + s.qOffset + q0 * s.qStride;
    for (int64_t k0 = 0; k0 < tile.keyEnd; k0 += kKeyTile) {
      int64_t cols = std::min(kKeyTile, tile.keyEnd - k0);
      const T *kTileRows = k + s.kvOffset + k0 * s.kvStride;
      const T *vTileRows = v + s.kvOffset + k0 * s.kvStride;
      gemmSerial(false, true, tile.rows, cols, headDim, scale, qTile, s.qStride, kTileRows,
                 s.kvStride, T(0), probs, cols);
      for (int64_t r = 0; r < tile.rows; ++r)
        expRow(probs + r * cols, double(rowLse[q0 + r]), visibleKeys(q0 + r, k0, cols, causal),
               cols);
      // Query heads of one group share k and v, so their dk and dv add up (beta = 1).
      gemmSerial(true, false, cols, headDim, tile.rows, T(1), probs, cols, dyTile, s.qStride, T(1),
                 dv + s.kvOffset + k0 * s.kvStride, s.kvStride);
      gemmSerial(false, true, tile.rows, cols, headDim, T(1), dyTile, s.qStride, vTileRows,
                 s.kvStride, T(0), dscores, cols);
      for (int64_t r = 0; r < tile.rows; ++r) {
        T *ds = dscores + r * cols;
        const T *p = probs + r * cols, d = delta[q0 + r];
#pragma omp simd
        for (int64_t u = 0; u < cols; ++u)
          ds[u] = p[u] * (ds[u] - d);
      }
      gemmSerial(false, false, tile.rows, headDim, cols, scale, dscores, cols, kTileRows,
                 s.kvStride, T(1), dq + s.qOffset + q0 * s.qStride, s.qStride);
      gemmSerial(true, false, cols, headDim, tile.rows, scale, dscores, cols, qTile, s.qStride,
                 T(1), dk + s.kvOffset + k0 * s.kvStride, s.kvStride);
    }
  }
}

} // namespace

template <typename T>
void flashAttentionForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seq,
                           int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim,
                           bool causal) {
  // y = softmax(s q k^T + mask) v a tile at a time; lse = m + log(l) per query row
  detail::parallelFor(batch * heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t slice = first; slice < last; ++slice)
      flashForwardSlice(y, lse + slice * seq, q, k, v,
                        headSlices(slice / heads, slice % heads, batch, heads, kvHeads, headDim),
                        seq, headDim, causal);
  });
}

template <typename T>
void flashAttentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                            const T *lse, const T *dy, int64_t seq, int64_t batch, int64_t heads,
                            int64_t kvHeads, int64_t headDim, bool causal) {
  // P = exp(s q k^T - lse); dv += P^T dy; dS = P (dy v^T - D), D = rowsum(dy y);
  // dq += s dS k; dk += s dS^T q
  int64_t group = heads / kvHeads;
  detail::parallelFor(batch * kvHeads, 1, [&](int64_t first, int64_t last) {
    for (int64_t kvSlice = first; kvSlice < last; ++kvSlice) {
      int64_t b = kvSlice / kvHeads, kvHead = kvSlice % kvHeads;
      HeadSlices lead = headSlices(b, kvHead * group, batch, heads, kvHeads, headDim);
      zeroRows(dk + lead.kvOffset, seq, headDim, lead.kvStride);
      zeroRows(dv + lead.kvOffset, seq, headDim, lead.kvStride);
      for (int64_t h = kvHead * group; h < (kvHead + 1) * group; ++h) {
        HeadSlices s = headSlices(b, h, batch, heads, kvHeads, headDim);
        zeroRows(dq + s.qOffset, seq, headDim, s.qStride);
        flashBackwardSlice(dq, dk, dv, q, k, v, y, lse + (b * heads + h) * seq, dy, s, seq, headDim,
                           causal);
      }
    }
  });
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
