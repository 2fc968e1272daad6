//===- KernelsMoETest.cpp - The mixture-of-experts kernels ----------------===//
//
// The routing on hand-made logits (top-k, ties, the expert-grouped rows, the load-balancing
// loss), and a whole MoE MLP built from the kernels as OpMoE.cpp runs it (router GEMM,
// dispatch, one GEMM per expert, SwiGLU or GELU, combine, the load-balancing loss) checked
// against central finite differences in fp64: the gradients of the router, every expert
// weight and the input.
//
//===----------------------------------------------------------------------===//

#include "GradCheck.h"
#include "RandomValues.h"
#include "parc/Runtime/Kernels.h"
#include "parc/Runtime/MoEKernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

using namespace parc::runtime::cpu;
using parc::test::dot;
using parc::test::numericGradient;
using parc::test::randomVec;
using parc::test::relativeError;

namespace {

using Vec = std::vector<double>;
using Index = std::vector<int64_t>;

TEST(MoEKernels, TopKTakesTheLargestLogitsAndTheLowerExpertOnATie) {
  // Token 0: experts 2 and 0 tie after 1; token 1: all four tie.
  Vec logits = {0.5, 2.0, 0.5, -1.0, 0.0, 0.0, 0.0, 0.0};
  MoERouting r = moeRoute(logits.data(), 2, 4, 2);
  EXPECT_EQ(r.expert, (Index{1, 0, 0, 1}));
  EXPECT_EQ(r.count, (Index{2, 2, 0, 0}));
  // Rows by expert, then by slot: expert 0 gets slots 1 and 2, expert 1 slots 0 and 3.
  EXPECT_EQ(r.row, (Index{2, 0, 1, 3}));
  Vec w = moeWeights(r, /*normalize=*/true);
  EXPECT_NEAR(w[2], 0.5, 1e-15);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-15);
  Vec raw = moeWeights(r, /*normalize=*/false);
  EXPECT_NEAR(raw[2], 0.25, 1e-15);
}

TEST(MoEKernels, DispatchAndCombineMoveRowsByTheRouting) {
  Vec logits = {0.5, 2.0, 0.5, -1.0, 0.0, 0.0, 0.0, 0.0};
  MoERouting r = moeRoute(logits.data(), 2, 4, 2);
  Vec x = {1, 2, 3, 4}; // two tokens of width 2
  Vec rows(8);
  moeDispatchForward(rows.data(), x.data(), r, 2);
  EXPECT_EQ(rows, (Vec{1, 2, 3, 4, 1, 2, 3, 4}));
  Vec out(4);
  moeCombineForward(out.data(), rows.data(), r, /*normalize=*/true, 2);
  // Identity experts: the normalised weights sum to one per token.
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(out[i], x[i], 1e-15);
  Vec dx(4);
  moeDispatchBackward(dx.data(), rows.data(), r, 2);
  EXPECT_EQ(dx, (Vec{2, 4, 6, 8}));
}

TEST(MoEKernels, AuxLossOfUniformRoutingIsTheCoefficient) {
  // Equal probabilities and loads: experts / (T^2 k) * E * (T / E) * (T k / E) = 1.
  Vec logits(4 * 4, 0.0);
  for (int64_t t = 0; t < 4; ++t) // token t prefers experts t and t + 1
    logits[size_t(t * 4 + t)] = logits[size_t(t * 4 + (t + 1) % 4)] = 1e-9;
  MoERouting r = moeRoute(logits.data(), 4, 4, 2);
  EXPECT_EQ(r.count, (Index{2, 2, 2, 2}));
  EXPECT_NEAR(moeAuxLoss(r, 0.01), 0.01, 1e-10);
}

/// One MoE MLP of `tokens` tokens: every weight the finite differences perturb.
struct MoEMLP {
  int64_t tokens = 6, hidden = 5, experts = 4, topK = 2, ffn = 3;
  bool swiglu = true, normalize = true;
  double auxLoss = 0.05, auxScale = 0.5;
  Vec x, router, gate, up, down, dout;

  /// y_e = x_e w_e^T over each expert's rows, as OpMoE.cpp's expert_matmul.
  static void expertMatMul(Vec &y, const Vec &x, const Vec &w, const MoERouting &r, int64_t n,
                      int64_t k) {
    int64_t first = 0;
    for (int64_t e = 0; e < r.experts; ++e) {
      if (int64_t m = r.count[size_t(e)])
        matmulForward(y.data() + first * n, x.data() + first * k, w.data() + e * n * k, m, n, k,
                      false, true);
      first += r.count[size_t(e)];
    }
  }
  static void expertMatMulBackward(Vec &dx, Vec &dw, const Vec &x, const Vec &w, const Vec &dy,
                              const MoERouting &r, int64_t n, int64_t k) {
    int64_t first = 0;
    for (int64_t e = 0; e < r.experts; ++e) {
      if (int64_t m = r.count[size_t(e)])
        matmulBackward(dx.data() + first * k, dw.data() + e * n * k, x.data() + first * k,
                       w.data() + e * n * k, dy.data() + first * n, m, n, k, false, true,
                       GradWrite::Add, GradWrite::Add);
      first += r.count[size_t(e)];
    }
  }

  MoERouting route() const {
    Vec logits(size_t(tokens * experts));
    matmulForward(logits.data(), x.data(), router.data(), tokens, experts, hidden, false, true);
    return moeRoute(logits.data(), tokens, experts, topK);
  }
  /// The smallest gap between a token's k-th and (k+1)-th logit: the finite differences must
  /// not change the routing.
  double routingMargin() const {
    Vec logits(size_t(tokens * experts));
    matmulForward(logits.data(), x.data(), router.data(), tokens, experts, hidden, false, true);
    double margin = 1e9;
    for (int64_t t = 0; t < tokens; ++t) {
      Vec l(logits.begin() + t * experts, logits.begin() + (t + 1) * experts);
      std::sort(l.rbegin(), l.rend());
      margin = std::min(margin, l[size_t(topK - 1)] - l[size_t(topK)]);
    }
    return margin;
  }

  /// What the backward reads: the routing and the expert MLP's rows.
  struct Activations {
    MoERouting r;
    Vec dispatched, g, u, a, y;
  };
  Activations forward() const {
    Activations f{route(), {}, {}, {}, {}, {}};
    const int64_t rows = tokens * topK;
    f.dispatched.resize(size_t(rows * hidden));
    f.g.resize(size_t(rows * ffn));
    f.u.resize(f.g.size());
    f.a.resize(f.g.size());
    f.y.resize(f.dispatched.size());
    moeDispatchForward(f.dispatched.data(), x.data(), f.r, hidden);
    if (swiglu)
      expertMatMul(f.g, f.dispatched, gate, f.r, ffn, hidden);
    expertMatMul(f.u, f.dispatched, up, f.r, ffn, hidden);
    if (swiglu)
      swigluForward(f.a.data(), f.g.data(), f.u.data(), rows, ffn);
    else
      geluForward(f.a.data(), f.u.data(), rows * ffn);
    expertMatMul(f.y, f.a, down, f.r, hidden, ffn);
    return f;
  }

  /// dout . mlp(x) + auxScale * aux(x).
  double loss() const {
    Activations f = forward();
    Vec out(x.size());
    moeCombineForward(out.data(), f.y.data(), f.r, normalize, hidden);
    return dot(dout, out) + auxScale * moeAuxLoss(f.r, auxLoss);
  }

  struct Grads {
    Vec x, router, gate, up, down;
  };
  /// The backward as MoELowering.cpp emits it.
  Grads backward() const {
    Activations f = forward();
    const MoERouting &r = f.r;
    const int64_t rows = tokens * topK;
    const Vec &dispatched = f.dispatched, &g = f.g, &u = f.u, &a = f.a, &y = f.y;

    Grads d{Vec(x.size()), Vec(router.size()), Vec(gate.size()), Vec(up.size()), Vec(down.size())};
    Vec dy(y.size()), dlogits(size_t(tokens * experts)), dAux(dlogits.size());
    moeCombineBackward(dy.data(), dlogits.data(), y.data(), dout.data(), r, normalize, hidden);
    moeAuxLossBackward(dAux.data(), r, auxLoss, auxScale);
    for (size_t i = 0; i < dlogits.size(); ++i)
      dlogits[i] += dAux[i];
    Vec da(a.size()), dg(g.size()), du(u.size()), drows(dispatched.size());
    expertMatMulBackward(da, d.down, a, down, dy, r, hidden, ffn);
    if (swiglu) {
      swigluBackward(dg.data(), du.data(), g.data(), u.data(), da.data(), rows, ffn);
      expertMatMulBackward(drows, d.gate, dispatched, gate, dg, r, ffn, hidden);
    } else {
      geluBackward(du.data(), u.data(), da.data(), rows * ffn);
    }
    expertMatMulBackward(drows, d.up, dispatched, up, du, r, ffn, hidden);
    moeDispatchBackward(d.x.data(), drows.data(), r, hidden);
    Vec dxRouter(x.size());
    matmulBackward(dxRouter.data(), d.router.data(), x.data(), router.data(), dlogits.data(),
                   tokens, experts, hidden, false, true, GradWrite::Overwrite, GradWrite::Add);
    for (size_t i = 0; i < x.size(); ++i)
      d.x[i] += dxRouter[i];
    return d;
  }
};

void checkMoEGradients(bool swiglu, bool normalize, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "swiglu " << swiglu << " normalize " << normalize);
  std::mt19937_64 rng(seed);
  MoEMLP mlp;
  mlp.swiglu = swiglu;
  mlp.normalize = normalize;
  mlp.x = randomVec(size_t(mlp.tokens * mlp.hidden), rng);
  mlp.router = randomVec(size_t(mlp.experts * mlp.hidden), rng);
  mlp.gate = randomVec(size_t(mlp.experts * mlp.ffn * mlp.hidden), rng, 0.5);
  mlp.up = randomVec(mlp.gate.size(), rng, 0.5);
  mlp.down = randomVec(mlp.gate.size(), rng, 0.5);
  mlp.dout = randomVec(mlp.x.size(), rng);
  // Central differences of 1e-5 move a logit by ~1e-4 at most.
  ASSERT_GT(mlp.routingMargin(), 1e-2) << "pick another seed: a token's routing is too close";
  MoERouting r = mlp.route();
  ASSERT_GT(*std::min_element(r.count.begin(), r.count.end()), 0) << "every expert gets rows";

  MoEMLP::Grads d = mlp.backward();
  auto loss = [&] { return mlp.loss(); };
  const double tolerance = 1e-8;
  EXPECT_LT(relativeError(d.router, numericGradient(loss, mlp.router)), tolerance) << "router";
  EXPECT_LT(relativeError(d.up, numericGradient(loss, mlp.up)), tolerance) << "up";
  EXPECT_LT(relativeError(d.down, numericGradient(loss, mlp.down)), tolerance) << "down";
  if (swiglu) {
    EXPECT_LT(relativeError(d.gate, numericGradient(loss, mlp.gate)), tolerance) << "gate";
  }
  EXPECT_LT(relativeError(d.x, numericGradient(loss, mlp.x)), tolerance) << "input";
}

TEST(MoEKernels, RouterExpertsAndInputGradientsMatchFiniteDifferences) {
  checkMoEGradients(/*swiglu=*/true, /*normalize=*/true, 11);
  checkMoEGradients(/*swiglu=*/true, /*normalize=*/false, 11);
  checkMoEGradients(/*swiglu=*/false, /*normalize=*/true, 11);
}

TEST(MoEKernels, TheAuxLossGradientMatchesFiniteDifferencesOfTheLogits) {
  // The counts are constants wherever the routing does not change, so the loss is smooth.
  std::mt19937_64 rng(5);
  const int64_t tokens = 5, experts = 3, topK = 2;
  Vec logits = randomVec(size_t(tokens * experts), rng);
  MoERouting r = moeRoute(logits.data(), tokens, experts, topK);
  Vec analytic(logits.size());
  moeAuxLossBackward(analytic.data(), r, 0.1, 0.25);
  auto loss = [&] { return 0.25 * moeAuxLoss(moeRoute(logits.data(), tokens, experts, topK), 0.1); };
  EXPECT_LT(relativeError(analytic, numericGradient(loss, logits)), 1e-8);
}

} // namespace
