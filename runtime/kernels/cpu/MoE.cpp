//===- MoE.cpp - Router, dispatch and combine of a MoE layer --------------===//
//
// MoEKernels.h: on host doubles, one token at a time.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/MoEKernels.h"

#include <algorithm>
#include <cmath>

namespace parc::runtime::cpu {

namespace {
/// dlogits[e] = p[e] (dp[e] - sum_i p[i] dp[i]): the softmax's backward.
void softmaxBackward(double *dlogits, const double *p, const double *dp, int64_t experts) {
  double mean = 0;
  for (int64_t e = 0; e < experts; ++e)
    mean += p[e] * dp[e];
  for (int64_t e = 0; e < experts; ++e)
    dlogits[e] = p[e] * (dp[e] - mean);
}
} // namespace

MoERouting moeRoute(const double *logits, int64_t tokens, int64_t experts, int64_t topK) {
  MoERouting r;
  r.tokens = tokens;
  r.experts = experts;
  r.topK = topK;
  r.prob.resize(size_t(tokens * experts));
  r.expert.resize(size_t(tokens * topK));
  r.row.resize(size_t(tokens * topK));
  r.count.assign(size_t(experts), 0);
  std::vector<char> taken(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const double *l = logits + t * experts;
    double *p = r.prob.data() + t * experts;
    double top = *std::max_element(l, l + experts), sum = 0;
    for (int64_t e = 0; e < experts; ++e)
      sum += p[e] = std::exp(l[e] - top);
    for (int64_t e = 0; e < experts; ++e)
      p[e] /= sum;
    // The largest logit not taken yet; the strict > keeps the lower expert on a tie.
    std::fill(taken.begin(), taken.end(), 0);
    for (int64_t j = 0; j < topK; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e)
        if (!taken[size_t(e)] && (best < 0 || l[e] > l[best]))
          best = e;
      taken[size_t(best)] = 1;
      r.expert[size_t(t * topK + j)] = best;
      ++r.count[size_t(best)];
    }
  }
  std::vector<int64_t> next(size_t(experts), 0);
  for (int64_t e = 1; e < experts; ++e)
    next[size_t(e)] = next[size_t(e - 1)] + r.count[size_t(e - 1)];
  for (int64_t s = 0; s < tokens * topK; ++s)
    r.row[size_t(s)] = next[size_t(r.expert[size_t(s)])]++;
  return r;
}

std::vector<double> moeWeights(const MoERouting &r, bool normalize) {
  std::vector<double> w(size_t(r.tokens * r.topK));
  for (int64_t t = 0; t < r.tokens; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < r.topK; ++j)
      sum += w[size_t(t * r.topK + j)] = r.prob[size_t(t * r.experts + r.expert[size_t(t * r.topK + j)])];
    if (normalize)
      for (int64_t j = 0; j < r.topK; ++j)
        w[size_t(t * r.topK + j)] /= sum;
  }
  return w;
}

void moeDispatchForward(double *rows, const double *x, const MoERouting &r, int64_t width) {
  for (int64_t s = 0; s < r.tokens * r.topK; ++s)
    std::copy_n(x + (s / r.topK) * width, width, rows + r.row[size_t(s)] * width);
}

void moeDispatchBackward(double *dx, const double *drows, const MoERouting &r, int64_t width) {
  std::fill_n(dx, r.tokens * width, 0.0);
  for (int64_t s = 0; s < r.tokens * r.topK; ++s) {
    const double *d = drows + r.row[size_t(s)] * width;
    double *o = dx + (s / r.topK) * width;
    for (int64_t c = 0; c < width; ++c)
      o[c] += d[c];
  }
}

void moeCombineForward(double *out, const double *y, const MoERouting &r, bool normalize,
                       int64_t width) {
  std::vector<double> w = moeWeights(r, normalize);
  std::fill_n(out, r.tokens * width, 0.0);
  for (int64_t s = 0; s < r.tokens * r.topK; ++s) {
    const double *in = y + r.row[size_t(s)] * width;
    double *o = out + (s / r.topK) * width;
    for (int64_t c = 0; c < width; ++c)
      o[c] += w[size_t(s)] * in[c];
  }
}

void moeCombineBackward(double *dy, double *dlogits, const double *y, const double *dout,
                        const MoERouting &r, bool normalize, int64_t width) {
  std::vector<double> w = moeWeights(r, normalize), dw(size_t(r.topK)), dp(size_t(r.experts));
  for (int64_t t = 0; t < r.tokens; ++t) {
    const double *g = dout + t * width;
    double sum = 0, dot = 0;
    for (int64_t j = 0; j < r.topK; ++j) {
      size_t s = size_t(t * r.topK + j);
      const double *in = y + r.row[s] * width;
      double *d = dy + r.row[s] * width;
      double dwj = 0;
      for (int64_t c = 0; c < width; ++c) {
        d[c] = w[s] * g[c];
        dwj += g[c] * in[c];
      }
      dw[size_t(j)] = dwj;
      sum += r.prob[size_t(t * r.experts + r.expert[s])];
      dot += dwj * w[s];
    }
    std::fill(dp.begin(), dp.end(), 0.0);
    for (int64_t j = 0; j < r.topK; ++j)
      dp[size_t(r.expert[size_t(t * r.topK + j)])] =
          normalize ? (dw[size_t(j)] - dot) / sum : dw[size_t(j)];
    softmaxBackward(dlogits + t * r.experts, r.prob.data() + t * r.experts, dp.data(), r.experts);
  }
}

namespace {
/// coefficient * experts / (tokens^2 top_k): the factor of each (sum_t p[t,e]) count_e.
double auxFactor(const MoERouting &r, double coefficient) {
  return coefficient * double(r.experts) /
         (double(r.tokens) * double(r.tokens) * double(r.topK));
}
} // namespace

double moeAuxLoss(const MoERouting &r, double coefficient) {
  double loss = 0;
  for (int64_t e = 0; e < r.experts; ++e) {
    double probSum = 0;
    for (int64_t t = 0; t < r.tokens; ++t)
      probSum += r.prob[size_t(t * r.experts + e)];
    loss += probSum * double(r.count[size_t(e)]);
  }
  return auxFactor(r, coefficient) * loss;
}

void moeAuxLossBackward(double *dlogits, const MoERouting &r, double coefficient, double scale) {
  std::vector<double> g(size_t(r.experts));
  for (int64_t e = 0; e < r.experts; ++e)
    g[size_t(e)] = scale * auxFactor(r, coefficient) * double(r.count[size_t(e)]);
  for (int64_t t = 0; t < r.tokens; ++t)
    softmaxBackward(dlogits + t * r.experts, r.prob.data() + t * r.experts, g.data(), r.experts);
}

} // namespace parc::runtime::cpu
