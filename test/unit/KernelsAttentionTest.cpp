//===- KernelsAttentionTest.cpp - CPU kernels: rotary embedding and attention ===//
//
// Rotary embedding and attention (standard and FlashAttention, multi-head and grouped-query,
// causal or not) against a loop-by-loop reference, their gradients against central finite
// differences in fp64 (as KernelsTest.cpp's), and FlashAttention against the standard kernels
// to rounding.
//
//===----------------------------------------------------------------------===//

#include "GradCheck.h"
#include "RandomValues.h"
#include "parc/Runtime/Kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

using namespace parc::runtime;
using namespace parc::runtime::cpu;
using namespace parc::test;

namespace {

//===----------------------------------------------------------------------===//
// Rotary embedding and attention
//===----------------------------------------------------------------------===//

TEST(KernelsTest, RopeRotatesHalvesAndItsGradientMatches) {
  std::mt19937_64 rng(7);
  const int64_t seq = 4, batch = 2, heads = 3, headDim = 4;
  const double theta = 10000.0;
  Vec x = randomVec(seq * batch * heads * headDim, rng), dy = randomVec(x.size(), rng);
  Vec y(x.size());
  ropeForward(y.data(), x.data(), seq, batch, heads, headDim, theta);
  // Position 0 is the identity; at position 1 pair (0, 2) turns by 1 radian and pair (1, 3)
  // by theta^(-1/2).
  for (int64_t i = 0; i < batch * heads * headDim; ++i)
    EXPECT_EQ(y[i], x[i]);
  const double *x1 = x.data() + batch * heads * headDim, *y1 = y.data() + batch * heads * headDim;
  EXPECT_NEAR(y1[0], x1[0] * std::cos(1.0) - x1[2] * std::sin(1.0), 1e-15);
  EXPECT_NEAR(y1[2], x1[2] * std::cos(1.0) + x1[0] * std::sin(1.0), 1e-15);
  EXPECT_NEAR(y1[1], x1[1] * std::cos(0.01) - x1[3] * std::sin(0.01), 1e-15);

  auto loss = [&] {
    ropeForward(y.data(), x.data(), seq, batch, heads, headDim, theta);
    return dot(dy, y);
  };
  Vec numeric = numericGradient(loss, x), dx(x.size());
  ropeBackward(dx.data(), dy.data(), seq, batch, heads, headDim, theta);
  EXPECT_LT(relativeError(dx, numeric), gradTolerance);
}

/// softmax(q k^T / sqrt(d)) v written out loop by loop.
Vec referenceAttention(const Vec &q, const Vec &k, const Vec &v, int64_t seq, int64_t batch,
                       int64_t heads, int64_t kvHeads, int64_t headDim, bool causal) {
  Vec y(q.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < seq; ++t) {
        int64_t g = h / (heads / kvHeads), keys = causal ? t + 1 : seq;
        auto qAt = [&](int64_t j) { return q[((t * batch + b) * heads + h) * headDim + j]; };
        auto kvAt = [&](const Vec &m, int64_t u, int64_t j) {
          return m[((u * batch + b) * kvHeads + g) * headDim + j];
        };
        Vec p(keys);
        double sum = 0;
        for (int64_t u = 0; u < keys; ++u) {
          double score = 0;
          for (int64_t j = 0; j < headDim; ++j)
            score += qAt(j) * kvAt(k, u, j);
          p[u] = std::exp(score / std::sqrt(double(headDim)));
          sum += p[u];
        }
        for (int64_t j = 0; j < headDim; ++j) {
          double out = 0;
          for (int64_t u = 0; u < keys; ++u)
            out += p[u] / sum * kvAt(v, u, j);
          y[((t * batch + b) * heads + h) * headDim + j] = out;
        }
      }
  return y;
}

/// Standard attention keeps [batch, heads, seq, seq] probabilities, flash [batch, heads, seq]
/// logsumexp rows; both run through these two.
struct AttentionRun {
  int64_t seq, batch, heads, kvHeads, headDim;
  bool causal, flash;

  Vec stats() const { return Vec(size_t(batch * heads * seq * (flash ? 1 : seq))); }
  void forward(Vec &y, Vec &stats, const Vec &q, const Vec &k, const Vec &v) const {
    if (flash)
      flashAttentionForward(y.data(), stats.data(), q.data(), k.data(), v.data(), seq, batch,
                            heads, kvHeads, headDim, causal);
    else
      attentionForward(y.data(), stats.data(), q.data(), k.data(), v.data(), seq, batch, heads,
                       kvHeads, headDim, causal);
  }
  void backward(Vec &dq, Vec &dk, Vec &dv, const Vec &q, const Vec &k, const Vec &v, const Vec &y,
                const Vec &stats, const Vec &dy) const {
    if (flash)
      flashAttentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(),
                             y.data(), stats.data(), dy.data(), seq, batch, heads, kvHeads,
                             headDim, causal);
    else
      attentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(),
                        stats.data(), dy.data(), seq, batch, heads, kvHeads, headDim, causal);
  }
};

void checkAttention(int64_t heads, int64_t kvHeads, bool causal, bool flash) {
  SCOPED_TRACE(testing::Message() << "heads " << heads << " kv_heads " << kvHeads << " causal "
                                  << causal << " flash " << flash);
  std::mt19937_64 rng(8 + heads * 10 + kvHeads + causal);
  const AttentionRun run{5, 2, heads, kvHeads, 3, causal, flash};
  const int64_t seq = run.seq, batch = run.batch, headDim = run.headDim;
  Vec q = randomVec(seq * batch * heads * headDim, rng);
  Vec k = randomVec(seq * batch * kvHeads * headDim, rng), v = randomVec(k.size(), rng);
  Vec dy = randomVec(q.size(), rng), y(q.size()), stats = run.stats();
  run.forward(y, stats, q, k, v);
  Vec expected = referenceAttention(q, k, v, seq, batch, heads, kvHeads, headDim, causal);
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], expected[i], 1e-13);

  auto loss = [&] {
    Vec scratch = run.stats();
    run.forward(y, scratch, q, k, v);
    return dot(dy, y);
  };
  Vec numericQ = numericGradient(loss, q), numericK = numericGradient(loss, k),
      numericV = numericGradient(loss, v);
  run.forward(y, stats, q, k, v);
  // Stale values in the outputs must not leak into the gradients.
  Vec dq = randomVec(q.size(), rng), dk = randomVec(k.size(), rng), dv = randomVec(v.size(), rng);
  run.backward(dq, dk, dv, q, k, v, y, stats, dy);
  EXPECT_LT(relativeError(dq, numericQ), gradTolerance);
  EXPECT_LT(relativeError(dk, numericK), gradTolerance);
  EXPECT_LT(relativeError(dv, numericV), gradTolerance);
}

TEST(KernelsTest, AttentionGroupedQueryGradients) { checkAttention(4, 2, true, false); }
TEST(KernelsTest, AttentionMultiHeadGradients) { checkAttention(4, 4, true, false); }
TEST(KernelsTest, AttentionWithoutMaskGradients) { checkAttention(4, 1, false, false); }
TEST(KernelsTest, FlashAttentionGroupedQueryGradients) { checkAttention(4, 2, true, true); }
TEST(KernelsTest, FlashAttentionWithoutMaskGradients) { checkAttention(4, 1, false, true); }

// Flash attention computes what standard attention computes, to rounding: the outputs and all
// three gradients. seq 150: three query tiles (64 + 64 + 22) against one key block; 600: ten
// query tiles against three key blocks, whose running max and sum rescale the partial outputs.
TEST(KernelsTest, FlashAttentionEqualsStandardToRounding) {
  for (auto [seq, causal] : {std::pair{150, true}, {150, false}, {600, true}, {600, false}}) {
    SCOPED_TRACE(testing::Message() << "seq " << seq << ", causal " << causal);
    std::mt19937_64 rng(21 + causal);
    AttentionRun standard{seq, 2, 4, 2, 8, causal, false}, flash = standard;
    flash.flash = true;
    int64_t n = standard.seq * standard.batch * standard.heads * standard.headDim;
    Vec q = randomVec(n, rng), k = randomVec(n / 2, rng), v = randomVec(n / 2, rng);
    Vec dy = randomVec(n, rng);
    Vec y(q.size()), yFlash(q.size()), probs = standard.stats(), lse = flash.stats();
    standard.forward(y, probs, q, k, v);
    flash.forward(yFlash, lse, q, k, v);
    EXPECT_LT(relativeError(yFlash, y), 1e-13);
    Vec dq(q.size()), dk(k.size()), dv(v.size()), dqF(q.size()), dkF(k.size()), dvF(v.size());
    standard.backward(dq, dk, dv, q, k, v, y, probs, dy);
    flash.backward(dqF, dkF, dvF, q, k, v, yFlash, lse, dy);
    EXPECT_LT(relativeError(dqF, dq), 1e-12);
    EXPECT_LT(relativeError(dkF, dk), 1e-12);
    EXPECT_LT(relativeError(dvF, dv), 1e-12);
  }
}

} // namespace
