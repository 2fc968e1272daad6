//===- Attention.cpp - rotary embedding and standard grouped-query attention ---===//
//
// q, k, v, y are [seq, batch, heads*headDim]: one (batch, head) slice is a seq x headDim
// matrix with row stride batch*heads*headDim, which cblas takes as its leading dimension, so
// every product runs on the activations in place. Standard attention (Megatron's unfused
// softmax) keeps the probabilities of every (batch, head), [batch, heads, seq, seq], for the
// backward; FlashAttention.cpp keeps only their row logsumexp.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "AttentionSlices.h"
#include "Blas.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

namespace parc::runtime::cpu {

using detail::gemm;
using detail::HeadSlices;
using detail::headSlices;

namespace {

// Turns each (j, j + headDim/2) pair of every head by `direction` times t * theta^(-2j/headDim);
// the pair is read before it is written, so y may alias x.
template <typename T>
void rotateHalves(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                  double theta, double direction, int64_t offset) {
  assert(headDim % 2 == 0 && "rotary embedding needs an even head size");
  int64_t half = headDim / 2;
  std::vector<double> cosTable(seq * half), sinTable(seq * half);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t j = 0; j < half; ++j) {
      double angle = double(offset + t) * std::pow(theta, -2.0 * j / headDim);
      cosTable[t * half + j] = std::cos(angle);
      sinTable[t * half + j] = direction * std::sin(angle);
    }
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
      const T *xh = x + (t * batch * heads + bh) * headDim;
      T *yh = y + (t * batch * heads + bh) * headDim;
      for (int64_t j = 0; j < half; ++j) {
        double c = cosTable[t * half + j], s = sinTable[t * half + j];
        double x1 = xh[j], x2 = xh[j + half];
        yh[j] = T(x1 * c - x2 * s);
        yh[j + half] = T(x2 * c + x1 * s);
      }
    }
}

// Row-wise softmax of scores [seq, seq] in place; with `causal`, row t keeps columns <= t and
// the others become exact zeros (which the backward relies on).
template <typename T> void softmaxRows(T *scores, int64_t seq, bool causal) {
  for (int64_t t = 0; t < seq; ++t) {
    T *row = scores + t * seq;
    int64_t valid = causal ? t + 1 : seq;
    T max = *std::max_element(row, row + valid);
    double sum = 0;
    for (int64_t u = 0; u < valid; ++u) {
      row[u] = std::exp(row[u] - max);
      sum += row[u];
    }
    for (int64_t u = 0; u < valid; ++u)
      row[u] = T(row[u] / sum);
    std::fill(row + valid, row + seq, T(0));
  }
}

// ds = p * (ds - sum(p * ds)) over one row: the softmax backward, ds holding dP on entry.
template <typename T> void softmaxRowBackward(T *ds, const T *p, int64_t n) {
  double dot = 0;
  for (int64_t u = 0; u < n; ++u)
    dot += double(p[u]) * ds[u];
  for (int64_t u = 0; u < n; ++u)
    ds[u] = T(p[u] * (ds[u] - dot));
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
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      HeadSlices s = headSlices(b, h, batch, heads, kvHeads, headDim);
      T *p = probs + (b * heads + h) * seq * seq;
      gemm(false, true, seq, seq, headDim, scale, q + s.qOffset, s.qStride, k + s.kvOffset,
           s.kvStride, T(0), p, seq);
      softmaxRows(p, seq, causal);
      gemm(false, false, seq, headDim, seq, T(1), p, seq, v + s.kvOffset, s.kvStride, T(0),
           y + s.qOffset, s.qStride);
    }
}

template <typename T>
void attentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *probs,
                       const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads,
                       int64_t headDim, bool causal) {
  // dv += P^T dy; dS = P (dP - rowsum(P dP)), dP = dy v^T; dq = s dS k; dk += s dS^T q
  (void)causal; // the masked probabilities are exact zeros, so dS is zero there too
  T scale = T(1.0 / std::sqrt(double(headDim)));
  std::fill(dk, dk + seq * batch * kvHeads * headDim, T(0));
  std::fill(dv, dv + seq * batch * kvHeads * headDim, T(0));
  std::vector<T> dscores(size_t(seq * seq));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      HeadSlices s = headSlices(b, h, batch, heads, kvHeads, headDim);
      const T *p = probs + (b * heads + h) * seq * seq;
      // Query heads of one group share k and v, so their dk and dv add up (beta = 1).
      gemm(true, false, seq, headDim, seq, T(1), p, seq, dy + s.qOffset, s.qStride, T(1),
           dv + s.kvOffset, s.kvStride);
      gemm(false, true, seq, seq, headDim, T(1), dy + s.qOffset, s.qStride, v + s.kvOffset,
           s.kvStride, T(0), dscores.data(), seq);
      for (int64_t t = 0; t < seq; ++t)
        softmaxRowBackward(dscores.data() + t * seq, p + t * seq, seq);
      gemm(false, false, seq, headDim, seq, scale, dscores.data(), seq, k + s.kvOffset, s.kvStride,
           T(0), dq + s.qOffset, s.qStride);
      gemm(true, false, seq, headDim, seq, scale, dscores.data(), seq, q + s.qOffset, s.qStride,
           T(1), dk + s.kvOffset, s.kvStride);
    }
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
