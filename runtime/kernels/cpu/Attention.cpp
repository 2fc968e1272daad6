//===- Attention.cpp - rotary embedding and standard grouped-query attention ---===//
//
// q, k, v, y are [seq, batch, heads*headDim]: one (batch, head) slice is a seq x headDim
// matrix with row stride batch*heads*headDim, which cblas takes as its leading dimension, so
// every product runs on the activations in place. Standard attention (Megatron's unfused
// softmax) keeps the probabilities of every (batch, head), [batch, heads, seq, seq], for the
// backward; FlashAttention.cpp keeps only their row logsumexp. The heads are a batch of small
// GEMMs: they run in parallel on the kernel threads, the backward by key/value head so that the
// query heads adding into one dk and dv share a thread.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "AttentionSlices.h"
#include "Blas.h"
#include "Rows.h"
#include "VecMath.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

namespace parc::runtime::cpu {

using detail::HeadSlices;
using detail::headSlices;

namespace {

// cos and sin of (offset + t) theta^(-2j/headDim), t < seq, j < headDim/2. Every block and
// micro-batch of a step asks for the same angles (in libm's sincos and pow, 2 % of a small
// Llama-style step), so the last table computed on this thread is kept.
struct RotaryTable {
  int64_t seq = -1, headDim = 0, offset = 0;
  double theta = 0;
  std::vector<double> cos, sin;
};
const RotaryTable &rotaryTable(int64_t seq, int64_t headDim, double theta, int64_t offset) {
  thread_local RotaryTable table;
  if (table.seq == seq && table.headDim == headDim && table.theta == theta &&
      table.offset == offset)
    return table;
  int64_t half = headDim / 2;
  table.seq = -1; // not valid until filled: the fill may throw
  table.cos.resize(size_t(seq * half));
  table.sin.resize(size_t(seq * half));
  double *cosOut = table.cos.data(), *sinOut = table.sin.data();
  detail::forRows(seq, half, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t)
      for (int64_t j = 0; j < half; ++j) {
        double angle = double(offset + t) * std::pow(theta, -2.0 * j / headDim);
        cosOut[t * half + j] = std::cos(angle);
        sinOut[t * half + j] = std::sin(angle);
      }
  });
  table.seq = seq;
  table.headDim = headDim;
  table.theta = theta;
  table.offset = offset;
  return table;
}

// Turns each (j, j + headDim/2) pair of every head by `direction` (+1 or -1) times
// t * theta^(-2j/headDim); the pair is read before it is written, so y may alias x.
template <typename T>
void rotateHalves(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                  double theta, double direction, int64_t offset) {
  assert(headDim % 2 == 0 && "rotary embedding needs an even head size");
  int64_t half = headDim / 2;
  const RotaryTable &table = rotaryTable(seq, headDim, theta, offset);
  const double *cosTable = table.cos.data(), *sinTable = table.sin.data();
  int64_t width = batch * heads * headDim;
  detail::forRows(seq, width, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t)
      for (int64_t bh = 0; bh < batch * heads; ++bh) {
        const T *xh = x + (t * batch * heads + bh) * headDim;
        T *yh = y + (t * batch * heads + bh) * headDim;
        for (int64_t j = 0; j < half; ++j) {
          double c = cosTable[t * half + j], s = direction * sinTable[t * half + j];
          double x1 = xh[j], x2 = xh[j + half];
          yh[j] = T(x1 * c - x2 * s);
          yh[j + half] = T(x2 * c + x1 * s);
        }
      }
  });
}

// Row-wise softmax of scores [seq, seq] in place; with `causal`, row t keeps columns <= t and
// the others become exact zeros (which the backward relies on).
void softmaxRows(double *scores, int64_t seq, bool causal) {
  for (int64_t t = 0; t < seq; ++t) {
    double *row = scores + t * seq;
    int64_t valid = causal ? t + 1 : seq;
    double max = *std::max_element(row, row + valid), sum = 0;
    for (int64_t u = 0; u < valid; ++u) {
      row[u] = std::exp(row[u] - max);
      sum += row[u];
    }
    for (int64_t u = 0; u < valid; ++u)
      row[u] = row[u] / sum;
    std::fill(row + valid, row + seq, 0.0);
  }
}

void softmaxRows(float *scores, int64_t seq, bool causal) {
  for (int64_t t = 0; t < seq; ++t) {
    float *row = scores + t * seq;
    int64_t valid = causal ? t + 1 : seq;
    float max = *std::max_element(row, row + valid), sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t u = 0; u < valid; ++u) {
      row[u] = detail::expf(row[u] - max);
      sum += row[u];
    }
    float inverse = 1.0f / sum;
#pragma omp simd
    for (int64_t u = 0; u < valid; ++u)
      row[u] *= inverse;
    std::fill(row + valid, row + seq, 0.0f);
  }
}

// dS = P * (dP - rowsum(P * dP)) in place of dP, row by row.
template <typename T> void softmaxBackwardRows(T *dscores, const T *probs, int64_t seq) {
  for (int64_t t = 0; t < seq; ++t) {
    const T *p = probs + t * seq;
    T *ds = dscores + t * seq;
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t u = 0; u < seq; ++u)
      dot += p[u] * ds[u];
#pragma omp simd
    for (int64_t u = 0; u < seq; ++u)
      ds[u] = p[u] * (ds[u] - dot);
  }
}

// A thread's seq x seq scratch matrix, kept between calls.
template <typename T> T *scratchMatrix(int64_t seq) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < size_t(seq * seq))
    buffer.resize(size_t(seq * seq));
  return buffer.data();
}

} // namespace

template <typename T>
void ropeForward(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                 double theta, int64_t offset) {
  // (y1, y2) = (x1 cos - x2 sin, x2 cos + x1 sin), angle (offset + t) * theta^(-2j/d)
  rotateHalves(y, x, seq, batch, heads, headDim, theta, 1.0, offset);
}

template <typename T>
void ropeBackward(T *dx, const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                  double theta, int64_t offset) {
  // (dx1, dx2) = (dy1 cos + dy2 sin, dy2 cos - dy1 sin)
  rotateHalves(dx, dy, seq, batch, heads, headDim, theta, -1.0, offset);
}

template <typename T>
void attentionForward(T *y, T *probs, const T *q, const T *k, const T *v, int64_t seq,
                      int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim, bool causal) {
  // P = softmax(q k^T / sqrt(d) + mask), y = P v per (batch, head); P is kept
  T scale = T(1.0 / std::sqrt(double(headDim)));
  detail::parallelFor(batch * heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t slice = first; slice < last; ++slice) {
      HeadSlices s = headSlices(slice / heads, slice % heads, batch, heads, kvHeads, headDim);
      T *p = probs + slice * seq * seq;
      detail::gemmSerial(false, true, seq, seq, headDim, scale, q + s.qOffset, s.qStride,
                         k + s.kvOffset, s.kvStride, T(0), p, seq);
      softmaxRows(p, seq, causal);
      detail::gemmSerial(false, false, seq, headDim, seq, T(1), p, seq, v + s.kvOffset,
                         s.kvStride, T(0), y + s.qOffset, s.qStride);
    }
  });
}

template <typename T>
void attentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *probs,
                       const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads,
                       int64_t headDim, bool causal) {
  // dv += P^T dy; dS = P (dP - rowsum(P dP)), dP = dy v^T; dq = s dS k; dk += s dS^T q
  (void)causal; // the masked probabilities are exact zeros, so dS is zero there too
  T scale = T(1.0 / std::sqrt(double(headDim)));
  int64_t group = heads / kvHeads;
  detail::parallelFor(batch * kvHeads, 1, [&](int64_t first, int64_t last) {
    T *dscores = scratchMatrix<T>(seq);
    for (int64_t kvSlice = first; kvSlice < last; ++kvSlice) {
      int64_t b = kvSlice / kvHeads, kvHead = kvSlice % kvHeads;
      HeadSlices lead = headSlices(b, kvHead * group, batch, heads, kvHeads, headDim);
      for (int64_t t = 0; t < seq; ++t) {
        std::fill_n(dk + lead.kvOffset + t * lead.kvStride, headDim, T(0));
        std::fill_n(dv + lead.kvOffset + t * lead.kvStride, headDim, T(0));
      }
      for (int64_t h = kvHead * group; h < (kvHead + 1) * group; ++h) {
        HeadSlices s = headSlices(b, h, batch, heads, kvHeads, headDim);
        const T *p = probs + (b * heads + h) * seq * seq;
        // Query heads of one group share k and v, so their dk and dv add up (beta = 1).
        detail::gemmSerial(true, false, seq, headDim, seq, T(1), p, seq, dy + s.qOffset,
                           s.qStride, T(1), dv + s.kvOffset, s.kvStride);
        detail::gemmSerial(false, true, seq, seq, headDim, T(1), dy + s.qOffset, s.qStride,
                           v + s.kvOffset, s.kvStride, T(0), dscores, seq);
        softmaxBackwardRows(dscores, p, seq);
        detail::gemmSerial(false, false, seq, headDim, seq, scale, dscores, seq, k + s.kvOffset,
                           s.kvStride, T(0), dq + s.qOffset, s.qStride);
        detail::gemmSerial(true, false, seq, headDim, seq, scale, dscores, seq, q + s.qOffset,
                           s.qStride, T(1), dk + s.kvOffset, s.kvStride);
      }
    }
  });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void ropeForward(T *, const T *, int64_t, int64_t, int64_t, int64_t, double, int64_t);  \
  template void ropeBackward(T *, const T *, int64_t, int64_t, int64_t, int64_t, double, int64_t); \
  template void attentionForward(T *, T *, const T *, const T *, const T *, int64_t, int64_t,       \
                                 int64_t, int64_t, int64_t, bool);                                 \
  template void attentionBackward(T *, T *, T *, const T *, const T *, const T *, const T *,       \
                                  const T *, int64_t, int64_t, int64_t, int64_t, int64_t, bool);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
