//===- KernelsTest.cpp - CPU kernels: gradients, shards, optimizer --------===//
//
// Every backward is checked against central finite differences of its forward in fp64, with
// random inputs bounded away from zero; sharded kernels (embedding, cross entropy) are checked
// to reassemble what one rank computes. The initialisation is in KernelsInitTest.cpp, rotary
// embedding and attention in KernelsAttentionTest.cpp.
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
#include <tuple>
#include <vector>

using namespace parc::runtime;
using namespace parc::runtime::cpu;
using namespace parc::test;

namespace {

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

TEST(KernelsTest, MatmulForwardAndBackwardForEveryTranspose) {
  std::mt19937_64 rng(1);
  const int64_t m = 3, n = 4, k = 5;
  for (bool transA : {false, true})
    for (bool transB : {false, true}) {
      SCOPED_TRACE(testing::Message() << "transA " << transA << " transB " << transB);
      Vec a = randomVec(m * k, rng), b = randomVec(k * n, rng), dc = randomVec(m * n, rng);
      auto at = [&](int64_t i, int64_t j) { return transA ? a[j * m + i] : a[i * k + j]; };
      auto bt = [&](int64_t i, int64_t j) { return transB ? b[j * k + i] : b[i * n + j]; };
      Vec c(m * n);
      matmulForward(c.data(), a.data(), b.data(), m, n, k, transA, transB);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double expected = 0;
          for (int64_t l = 0; l < k; ++l)
            expected += at(i, l) * bt(l, j);
          EXPECT_NEAR(c[i * n + j], expected, 1e-13);
        }
      auto loss = [&] {
        matmulForward(c.data(), a.data(), b.data(), m, n, k, transA, transB);
        return dot(dc, c);
      };
      Vec numericA = numericGradient(loss, a), numericB = numericGradient(loss, b);
      // da overwrites whatever was there; db adds to what it held.
      Vec da = randomVec(a.size(), rng), heldB = randomVec(b.size(), rng), db = heldB;
      matmulBackward(da.data(), db.data(), a.data(), b.data(), dc.data(), m, n, k, transA, transB,
                     GradWrite::Overwrite, GradWrite::Add);
      EXPECT_LT(relativeError(da, numericA), gradTolerance);
      EXPECT_LT(relativeError(minus(db, heldB), numericB), gradTolerance);
      // The other way round, and a null output is skipped.
      Vec heldA = randomVec(a.size(), rng);
      da = heldA;
      matmulBackward(da.data(), static_cast<double *>(nullptr), a.data(), b.data(), dc.data(), m, n,
                     k, transA, transB, GradWrite::Add, GradWrite::Overwrite);
      EXPECT_LT(relativeError(minus(da, heldA), numericA), gradTolerance);
    }
}

TEST(KernelsTest, KernelThreadsCanBeSet) {
  setKernelThreads(3);
  EXPECT_EQ(kernelThreads(), 3);
  setKernelThreads(0);
  EXPECT_EQ(kernelThreads(), 1);
}

TEST(KernelsTest, BiasAddAndResidualAddGradients) {
  std::mt19937_64 rng(2);
  const int64_t rows = 3, dim = 4;
  Vec x = randomVec(rows * dim, rng), bias = randomVec(dim, rng), dy = randomVec(rows * dim, rng);
  Vec y(rows * dim);
  auto loss = [&] {
    biasAddForward(y.data(), x.data(), bias.data(), rows, dim);
    return dot(dy, y);
  };
  Vec numericX = numericGradient(loss, x), numericBias = numericGradient(loss, bias);
  Vec dx(x.size()), held = randomVec(dim, rng), dbias = held;
  biasAddBackward(dx.data(), dbias.data(), dy.data(), rows, dim);
  EXPECT_LT(relativeError(dx, numericX), gradTolerance);
  EXPECT_LT(relativeError(minus(dbias, held), numericBias), gradTolerance);

  Vec a = randomVec(rows * dim, rng), b = randomVec(rows * dim, rng);
  auto residualLoss = [&] {
    residualAddForward(y.data(), a.data(), b.data(), rows * dim);
    return dot(dy, y);
  };
  Vec numericA = numericGradient(residualLoss, a), numericB = numericGradient(residualLoss, b);
  Vec da(a.size()), db(b.size());
  residualAddBackward(da.data(), db.data(), dy.data(), rows * dim);
  EXPECT_LT(relativeError(da, numericA), gradTolerance);
  EXPECT_LT(relativeError(db, numericB), gradTolerance);
}

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

TEST(KernelsTest, EmbeddingGradientAndVocabShardsSumToTheWholeTable) {
  std::mt19937_64 rng(3);
  const int64_t seq = 3, batch = 2, hidden = 4, vocab = 6;
  const std::vector<int64_t> ids = {0, 5, 3, 2, 3, 4}; // [batch, seq]: rows of both halves
  Vec weight = randomVec(vocab * hidden, rng), dy = randomVec(seq * batch * hidden, rng);
  Vec y(seq * batch * hidden);
  embeddingForward(y.data(), ids.data(), weight.data(), seq, batch, hidden, 0, vocab);
  // Row (t, b) of y is token ids[b * seq + t].
  for (int64_t i = 0; i < hidden; ++i)
    EXPECT_EQ(y[(1 * batch + 0) * hidden + i], weight[5 * hidden + i]);

  auto loss = [&] {
    embeddingForward(y.data(), ids.data(), weight.data(), seq, batch, hidden, 0, vocab);
    return dot(dy, y);
  };
  Vec numeric = numericGradient(loss, weight);
  Vec held = randomVec(weight.size(), rng), dweight = held;
  embeddingBackward(dweight.data(), ids.data(), dy.data(), seq, batch, hidden, 0, vocab);
  EXPECT_LT(relativeError(minus(dweight, held), numeric), gradTolerance);

  // Two vocab shards of three rows: their outputs sum to the whole lookup (the tp all-reduce)
  // and their gradients are the whole table's rows.
  const int64_t half = vocab / 2;
  Vec ySum(y.size(), 0.0), dweightWhole(weight.size(), 0.0);
  embeddingForward(y.data(), ids.data(), weight.data(), seq, batch, hidden, 0, vocab);
  embeddingBackward(dweightWhole.data(), ids.data(), dy.data(), seq, batch, hidden, 0, vocab);
  for (int64_t shard = 0; shard < 2; ++shard) {
    Vec part(weight.begin() + shard * half * hidden, weight.begin() + (shard + 1) * half * hidden);
    Vec yPart(y.size()), dpart(part.size(), 0.0);
    embeddingForward(yPart.data(), ids.data(), part.data(), seq, batch, hidden, shard * half, half);
    for (size_t i = 0; i < y.size(); ++i)
      ySum[i] += yPart[i];
    embeddingBackward(dpart.data(), ids.data(), dy.data(), seq, batch, hidden, shard * half, half);
    EXPECT_EQ(dpart, Vec(dweightWhole.begin() + shard * half * hidden,
                         dweightWhole.begin() + (shard + 1) * half * hidden));
  }
  EXPECT_EQ(ySum, y);
}

TEST(KernelsTest, PositionEmbeddingGradient) {
  std::mt19937_64 rng(4);
  const int64_t seq = 3, batch = 2, hidden = 4;
  Vec x = randomVec(seq * batch * hidden, rng), weight = randomVec(seq * hidden, rng);
  Vec dy = randomVec(x.size(), rng), y(x.size());
  auto loss = [&] {
    positionEmbeddingForward(y.data(), x.data(), weight.data(), seq, batch, hidden);
    return dot(dy, y);
  };
  Vec numericX = numericGradient(loss, x), numericW = numericGradient(loss, weight);
  Vec dx(x.size()), held = randomVec(weight.size(), rng), dweight = held;
  positionEmbeddingBackward(dx.data(), dweight.data(), dy.data(), seq, batch, hidden);
  EXPECT_LT(relativeError(dx, numericX), gradTolerance);
  EXPECT_LT(relativeError(minus(dweight, held), numericW), gradTolerance);
}

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

TEST(KernelsTest, LayerNormNormalisesAndItsGradientsMatch) {
  std::mt19937_64 rng(5);
  const int64_t rows = 3, dim = 5;
  const double eps = 1e-5;
  Vec x = randomVec(rows * dim, rng), weight = randomVec(dim, rng), bias = randomVec(dim, rng);
  Vec dy = randomVec(x.size(), rng), y(x.size());
  Vec one(dim, 1.0), zero(dim, 0.0);
  layerNormForward(y.data(), x.data(), one.data(), zero.data(), rows, dim, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, square = 0;
    for (int64_t i = 0; i < dim; ++i) {
      mean += y[r * dim + i] / dim;
      square += y[r * dim + i] * y[r * dim + i] / dim;
    }
    EXPECT_NEAR(mean, 0.0, 1e-14);
    EXPECT_NEAR(square, 1.0, 1e-14);
  }
  auto loss = [&] {
    layerNormForward(y.data(), x.data(), weight.data(), bias.data(), rows, dim, eps);
    return dot(dy, y);
  };
  Vec numericX = numericGradient(loss, x), numericW = numericGradient(loss, weight),
      numericB = numericGradient(loss, bias);
  Vec dx(x.size()), heldW = randomVec(dim, rng), heldB = randomVec(dim, rng);
  Vec dweight = heldW, dbias = heldB;
  layerNormBackward(dx.data(), dweight.data(), dbias.data(), x.data(), weight.data(), dy.data(),
                    rows, dim, eps);
  EXPECT_LT(relativeError(dx, numericX), gradTolerance);
  EXPECT_LT(relativeError(minus(dweight, heldW), numericW), gradTolerance);
  EXPECT_LT(relativeError(minus(dbias, heldB), numericB), gradTolerance);
}

TEST(KernelsTest, RMSNormNormalisesAndItsGradientsMatch) {
  std::mt19937_64 rng(6);
  const int64_t rows = 3, dim = 5;
  const double eps = 1e-6;
  Vec x = randomVec(rows * dim, rng), weight = randomVec(dim, rng);
  Vec dy = randomVec(x.size(), rng), y(x.size()), one(dim, 1.0);
  rmsNormForward(y.data(), x.data(), one.data(), rows, dim, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double square = 0;
    for (int64_t i = 0; i < dim; ++i)
      square += y[r * dim + i] * y[r * dim + i] / dim;
    EXPECT_NEAR(square, 1.0, 1e-14);
  }
  auto loss = [&] {
    rmsNormForward(y.data(), x.data(), weight.data(), rows, dim, eps);
    return dot(dy, y);
  };
  Vec numericX = numericGradient(loss, x), numericW = numericGradient(loss, weight);
  Vec dx(x.size()), held = randomVec(dim, rng), dweight = held;
  rmsNormBackward(dx.data(), dweight.data(), x.data(), weight.data(), dy.data(), rows, dim, eps);
  EXPECT_LT(relativeError(dx, numericX), gradTolerance);
  EXPECT_LT(relativeError(minus(dweight, held), numericW), gradTolerance);
}

//===----------------------------------------------------------------------===//
// Activations
//===----------------------------------------------------------------------===//

TEST(KernelsTest, GeluIsTheErfFormAndItsGradientMatches) {
  Vec points = {1.0, -1.0}, values(2);
  geluForward(values.data(), points.data(), 2);
  EXPECT_NEAR(values[0], 0.8413447460685429, 1e-15);
  EXPECT_NEAR(values[1], -0.15865525393145707, 1e-15);

  std::mt19937_64 rng(9);
  Vec x = randomVec(7, rng, 2.0), dy = randomVec(7, rng), y(7);
  auto loss = [&] {
    geluForward(y.data(), x.data(), 7);
    return dot(dy, y);
  };
  Vec numeric = numericGradient(loss, x), dx(7);
  geluBackward(dx.data(), x.data(), dy.data(), 7);
  EXPECT_LT(relativeError(dx, numeric), gradTolerance);
}

TEST(KernelsTest, SwigluGatesUpAndItsGradientMatches) {
  Vec gateAt = {1.0}, upAt = {2.0}, value(1);
  swigluForward(value.data(), gateAt.data(), upAt.data(), 1, 1);
  EXPECT_NEAR(value[0], 2.0 / (1.0 + std::exp(-1.0)), 1e-15);

  std::mt19937_64 rng(10);
  const int64_t rows = 3, ffn = 4;
  Vec gate = randomVec(rows * ffn, rng, 2.0), up = randomVec(rows * ffn, rng, 2.0);
  Vec dy = randomVec(rows * ffn, rng), y(rows * ffn);
  auto loss = [&] {
    swigluForward(y.data(), gate.data(), up.data(), rows, ffn);
    return dot(dy, y);
  };
  Vec numericGate = numericGradient(loss, gate), numericUp = numericGradient(loss, up);
  Vec dgate(gate.size()), dup(up.size());
  swigluBackward(dgate.data(), dup.data(), gate.data(), up.data(), dy.data(), rows, ffn);
  EXPECT_LT(relativeError(dgate, numericGate), gradTolerance);
  EXPECT_LT(relativeError(dup, numericUp), gradTolerance);
}

//===----------------------------------------------------------------------===//
// Cross entropy
//===----------------------------------------------------------------------===//

struct CrossEntropyCase {
  int64_t seq = 3, batch = 2, vocab = 8;
  std::vector<int64_t> labels = {0, 7, 3, 4, 2, 5}; // [batch, seq], in both vocab halves
  double dloss = 0.37;
};

/// Runs the pieces the executor interleaves with all-reduces on `shards` column blocks of
/// `logits`, reducing across shards as the all-reduces would; returns the loss and, in
/// `grads`, each shard's dlogits.
double shardedCrossEntropy(const CrossEntropyCase &c, const Vec &logits, int64_t shards,
                           std::vector<Vec> *grads = nullptr) {
  const int64_t rows = c.seq * c.batch, width = c.vocab / shards;
  std::vector<Vec> parts(shards, Vec(rows * width));
  for (int64_t s = 0; s < shards; ++s)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < width; ++j)
        parts[s][r * width + j] = logits[r * c.vocab + s * width + j];
  Vec rowMax(rows, -INFINITY), rowSum(rows, 0.0), target(rows, 0.0), piece(rows);
  for (int64_t s = 0; s < shards; ++s) {
    crossEntropyRowMax(piece.data(), parts[s].data(), rows, width);
    for (int64_t r = 0; r < rows; ++r)
      rowMax[r] = std::max(rowMax[r], piece[r]);
  }
  for (int64_t s = 0; s < shards; ++s) {
    crossEntropySumExp(piece.data(), parts[s].data(), rowMax.data(), rows, width);
    for (int64_t r = 0; r < rows; ++r)
      rowSum[r] += piece[r];
    crossEntropyTargetLogit(piece.data(), parts[s].data(), c.labels.data(), c.seq, c.batch, width,
                            s * width);
    for (int64_t r = 0; r < rows; ++r)
      target[r] += piece[r];
  }
  if (grads) {
    grads->assign(shards, Vec(rows * width));
    for (int64_t s = 0; s < shards; ++s)
      crossEntropyBackward((*grads)[s].data(), parts[s].data(), c.labels.data(), rowMax.data(),
                           rowSum.data(), c.dloss, c.seq, c.batch, width, s * width);
  }
  return crossEntropyLoss(rowMax.data(), rowSum.data(), target.data(), rows);
}

TEST(KernelsTest, CrossEntropyOnOneShardMatchesLogSoftmaxAndItsGradient) {
  CrossEntropyCase c;
  std::mt19937_64 rng(11);
  Vec logits = randomVec(c.seq * c.batch * c.vocab, rng, 3.0);
  double expected = 0;
  for (int64_t t = 0; t < c.seq; ++t)
    for (int64_t b = 0; b < c.batch; ++b) {
      const double *row = logits.data() + (t * c.batch + b) * c.vocab;
      double sum = 0;
      for (int64_t j = 0; j < c.vocab; ++j)
        sum += std::exp(row[j]);
      expected += std::log(sum) - row[c.labels[b * c.seq + t]];
    }
  expected /= c.seq * c.batch;
  std::vector<Vec> grads;
  EXPECT_NEAR(shardedCrossEntropy(c, logits, 1, &grads), expected, 1e-14);
  Vec numeric =
      numericGradient([&] { return c.dloss * shardedCrossEntropy(c, logits, 1); }, logits);
  EXPECT_LT(relativeError(grads[0], numeric), gradTolerance);
}

TEST(KernelsTest, CrossEntropyOverTwoVocabShardsEqualsOneShard) {
  CrossEntropyCase c;
  std::mt19937_64 rng(12);
  Vec logits = randomVec(c.seq * c.batch * c.vocab, rng, 3.0);
  std::vector<Vec> whole, halves;
  double loss = shardedCrossEntropy(c, logits, 1, &whole);
  EXPECT_NEAR(shardedCrossEntropy(c, logits, 2, &halves), loss, 1e-14);
  const int64_t width = c.vocab / 2;
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t r = 0; r < c.seq * c.batch; ++r)
      for (int64_t j = 0; j < width; ++j)
        EXPECT_NEAR(halves[s][r * width + j], whole[0][r * c.vocab + s * width + j], 1e-16);
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

TEST(KernelsTest, AdamWStepsAgainstHandComputation) {
  AdamWConfig config;
  config.lr = 0.1;
  config.beta1 = 0.9;
  config.beta2 = 0.99;
  config.eps = 1e-8;
  config.weightDecay = 0.5;
  Vec param = {1.0, -2.0}, m(2, 0.0), v(2, 0.0);
  // Step 1: mhat = g and vhat = g^2, so the step is lr * sign(g) (up to eps) after the decay.
  Vec grad = {0.5, -0.25};
  adamwStep(param.data(), grad.data(), m.data(), v.data(), 2, config);
  EXPECT_NEAR(param[0], 1.0 * 0.95 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  EXPECT_NEAR(param[1], -2.0 * 0.95 + 0.1 * 0.25 / (0.25 + 1e-8), 1e-15);
  EXPECT_NEAR(m[0], 0.05, 1e-15);
  EXPECT_NEAR(v[0], 0.0025, 1e-15);
  // Step 2 on parameter 0 with g = 1: m = 0.9 * 0.05 + 0.1 = 0.145, v = 0.99 * 0.0025 + 0.01 =
  // 0.012475; mhat = 0.145 / 0.19, vhat = 0.012475 / 0.0199.
  config.step = 2;
  grad = {1.0, 0.0};
  double before = param[0];
  adamwStep(param.data(), grad.data(), m.data(), v.data(), 2, config);
  double expected = before * 0.95 - 0.1 * (0.145 / 0.19) / (std::sqrt(0.012475 / 0.0199) + 1e-8);
  EXPECT_NEAR(param[0], expected, 1e-15);
}

TEST(KernelsTest, SGDStepsAgainstHandComputation) {
  SGDConfig config;
  config.lr = 0.1;
  config.momentum = 0.9;
  config.weightDecay = 0.1;
  Vec param = {1.0}, buffer = {0.0}, grad = {0.5};
  // Step 1: buf = 0.5 + 0.1 * 1 = 0.6, p = 1 - 0.06 = 0.94.
  sgdStep(param.data(), grad.data(), buffer.data(), 1, config);
  EXPECT_NEAR(buffer[0], 0.6, 1e-15);
  EXPECT_NEAR(param[0], 0.94, 1e-15);
  // Step 2: buf = 0.9 * 0.6 + 0.5 + 0.094 = 1.134, p = 0.94 - 0.1134 = 0.8266.
  sgdStep(param.data(), grad.data(), buffer.data(), 1, config);
  EXPECT_NEAR(buffer[0], 1.134, 1e-15);
  EXPECT_NEAR(param[0], 0.8266, 1e-15);
  // Without momentum there is no buffer: p = 1 - 0.1 * (0.5 + 0.1).
  config.momentum = 0.0;
  param = {1.0};
  sgdStep(param.data(), grad.data(), static_cast<double *>(nullptr), 1, config);
  EXPECT_NEAR(param[0], 0.94, 1e-15);
}

TEST(KernelsTest, SquaredSumAndScale) {
  Vec x = {3.0, -4.0, 12.0};
  EXPECT_EQ(squaredSum(x.data(), 3), 169.0);
  scale(x.data(), 3, 0.5);
  EXPECT_EQ(x, (Vec{1.5, -2.0, 6.0}));
  std::vector<float> f = {1.0f, 2.0f};
  EXPECT_EQ(squaredSum(f.data(), 2), 5.0);
}

// The clipping factor folded into the step reads the bits scale() would have left in the
// gradient: both steps give the same parameters and moments, bit for bit.
template <typename T> void expectGradScaleFoldsExactly() {
  std::mt19937_64 rng(29);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t n = 1037; // not a multiple of any vector width
  std::vector<T> grad(n), param(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    grad[i] = T(normal(rng));
    param[i] = T(normal(rng));
    m[i] = T(0.1 * normal(rng));
    v[i] = T(std::abs(0.01 * normal(rng)));
  }
  const double factor = 1.0 / (3.7 + 1e-6);
  std::vector<T> scaled = grad;
  scale(scaled.data(), n, factor);

  AdamWConfig adam;
  adam.weightDecay = 0.1;
  adam.step = 3;
  std::vector<T> p1 = param, m1 = m, v1 = v, p2 = param, m2 = m, v2 = v;
  adamwStep(p1.data(), scaled.data(), m1.data(), v1.data(), n, adam);
  adam.gradScale = factor;
  adamwStep(p2.data(), grad.data(), m2.data(), v2.data(), n, adam);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);

  SGDConfig sgd;
  sgd.momentum = 0.9;
  sgd.weightDecay = 0.1;
  std::vector<T> q1 = param, b1 = m, q2 = param, b2 = m;
  sgdStep(q1.data(), scaled.data(), b1.data(), n, sgd);
  sgd.gradScale = factor;
  sgdStep(q2.data(), grad.data(), b2.data(), n, sgd);
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(b1, b2);
}

TEST(KernelsTest, GradScaleInTheStepEqualsScalingTheGradientFirst) {
  expectGradScaleFoldsExactly<float>();
  expectGradScaleFoldsExactly<double>();
}

// The float step (float arithmetic) against the double one from the same float state: the
// new parameters and moments within a few float roundings of their terms (a moment that
// cancels to near zero keeps the terms' absolute error; measured: 1.24e-7).
TEST(KernelsTest, FloatAdamWAgreesWithDouble) {
  const int64_t n = 1037;
  auto param = randomValues<float>(n, 41), grad = randomValues<float>(n, 42, 1e-3);
  auto m = randomValues<float>(n, 43, 1e-4), v = randomValues<float>(n, 44, 1e-6);
  for (float &value : v)
    value = std::abs(value);
  std::vector<double> paramD(param.begin(), param.end()), gradD(grad.begin(), grad.end());
  std::vector<double> mD(m.begin(), m.end()), vD(v.begin(), v.end());
  AdamWConfig adam;
  adam.weightDecay = 0.1;
  adam.step = 5;
  adam.gradScale = 0.7;
  // Each output's terms: p and the step's scale, stepSize(); the moments' two products.
  std::vector<double> termsP(n), termsM(n), termsV(n);
  for (size_t k = 0; k < size_t(n); ++k) {
    double g = double(grad[k]) * adam.gradScale;
    termsM[k] = adam.beta1 * std::abs(mD[k]) + (1 - adam.beta1) * std::abs(g);
    termsV[k] = adam.beta2 * vD[k] + (1 - adam.beta2) * g * g;
    termsP[k] = std::abs(paramD[k]) + adam.stepSize();
  }
  adamwStep(param.data(), grad.data(), m.data(), v.data(), n, adam);
  adamwStep(paramD.data(), gradD.data(), mD.data(), vD.data(), n, adam);
  double worst = 0;
  for (size_t k = 0; k < size_t(n); ++k)
    for (auto [got, want, terms] : {std::tuple{param[k], paramD[k], termsP[k]},
                                    {m[k], mD[k], termsM[k]}, {v[k], vD[k], termsV[k]}})
      worst = std::max(worst, std::abs(double(got) - want) / terms);
  EXPECT_LT(worst, 4e-7);
}

TEST(KernelsTest, SquaredSumOfALongVectorAgreesWithALongDoubleSum) {
  std::mt19937_64 rng(31);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t n = 3 * 4096 + 45; // whole blocks, a short one, lanes left over
  std::vector<float> f(n);
  long double reference = 0;
  for (int64_t i = 0; i < n; ++i) {
    f[i] = float(normal(rng));
    reference += (long double)f[i] * f[i];
  }
  EXPECT_NEAR(squaredSum(f.data(), n), double(reference), 1e-13 * double(reference));
}

TEST(KernelsTest, FloatKernelsAgreeWithDouble) {
  std::mt19937_64 rng(13);
  const int64_t seq = 4, batch = 2, heads = 2, headDim = 4;
  Vec q = randomVec(seq * batch * heads * headDim, rng), k = randomVec(q.size(), rng),
      v = randomVec(q.size(), rng), y(q.size());
  std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end()),
      yf(q.size());
  Vec probs(size_t(batch * heads * seq * seq));
  std::vector<float> probsf(probs.size());
  attentionForward(y.data(), probs.data(), q.data(), k.data(), v.data(), seq, batch, heads, heads,
                   headDim, true);
  attentionForward(yf.data(), probsf.data(), qf.data(), kf.data(), vf.data(), seq, batch, heads,
                   heads, headDim, true);
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(yf[i], y[i], 1e-5);
}

} // namespace
