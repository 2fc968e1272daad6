//===- KernelsFastTest.cpp - CPU kernels: fused, vectorised and threaded paths ----===//
//
// The fused kernels give the bits of the unfused pairs; the fp32 transcendentals stay within
// a few float roundings of libm in double; the kernel threads cover every range once
// (KernelsThreadsTest.cpp: the kernels give the same bits on any number of threads); a kernel
// that overwrites its output writes every element of it.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "../../runtime/kernels/cpu/Parallel.h"
#include "../../runtime/kernels/cpu/VecMath.h"
#include "RandomValues.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace parc::runtime;
using namespace parc::runtime::cpu;
using parc::test::randomValues;

namespace {

/// Restores the kernel threads a test changed.
struct ThreadsScope {
  int64_t saved = kernelThreads();
  explicit ThreadsScope(int64_t threads) { setKernelThreads(threads); }
  ~ThreadsScope() { setKernelThreads(saved); }
};

TEST(KernelsFastTest, ParallelForCoversEveryIndexOnceAndNestsInline) {
  ThreadsScope threads(3);
  std::vector<std::atomic<int>> hits(1000);
  std::atomic<int> parts{0}, nestedParts{0};
  for (int job = 0; job < 50; ++job) // jobs one after another: no chunk of one runs in the next
    detail::parallelFor(1000, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        ++hits[size_t(i)];
      ++parts;
      EXPECT_EQ(detail::availableThreads(), 1);
      detail::parallelFor(10, 1, [&](int64_t b, int64_t e) {
        EXPECT_EQ(b, 0);
        EXPECT_EQ(e, 10);
        ++nestedParts;
      });
    });
  for (const std::atomic<int> &hit : hits)
    EXPECT_EQ(hit.load(), 50);
  EXPECT_EQ(parts.load(), 50 * 3 * detail::chunksPerThread);
  EXPECT_EQ(nestedParts.load(), parts.load());
}

// VecMath.h's float exponential, which the fp32 softmaxes, the loss and GELU use: within 2 ulp
// of the double one from the smallest normal float to 2^127.5, finite above (n = 128 once made
// its top binade infinite), 0 below, exp(-inf) included.
TEST(KernelsFastTest, ExpfIsWithinTwoUlpsAndFiniteAtBothEnds) {
  auto ulps = [](float x) {
    double want = std::exp(double(x));
    float near = float(want), ulp = std::nextafter(near, INFINITY) - near;
    return std::fabs(double(detail::expf(x)) - want) / ulp;
  };
  double worst = 0;
  for (int i = 0; i <= 12820; ++i) // up to 88.30
    worst = std::max(worst, ulps(-87.33f + 0.0137f * float(i)));
  for (float x : {88.3f, 88.37f, 88.375f, 88.376f})
    worst = std::max(worst, ulps(x));
  EXPECT_LT(worst, 2.0);
  EXPECT_EQ(detail::expf(0.0f), 1.0f);
  float top = detail::expf(88.376f);
  EXPECT_TRUE(std::isfinite(top));
  for (float x : {88.38f, 88.4f, 88.72f, 88.73f, 1e30f, INFINITY})
    EXPECT_EQ(detail::expf(x), top) << x;
  EXPECT_EQ(detail::expf(-88.0f), 0.0f);
  EXPECT_EQ(detail::expf(-1e30f), 0.0f);
  EXPECT_EQ(detail::expf(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(detail::expf(NAN)));
}

// A GEMM dimension beyond OpenBLAS's 32-bit index fails before anything is read, on any
// number of threads (whose blocks of it might each fit), instead of wrapping around.
TEST(KernelsFastTest, AGemmTooLargeForOpenBlasFailsBeforeReading) {
  std::vector<float> small(16);
  int64_t huge = int64_t(1) << 31;
  for (int64_t threads : {1, 2}) {
    ThreadsScope scope(threads);
    EXPECT_THROW(matmulForward(small.data(), small.data(), small.data(), huge, 1, 1, false, false),
                 std::length_error);
    EXPECT_THROW(matmulForward(small.data(), small.data(), small.data(), 1, huge, 1, false, false),
                 std::length_error);
    EXPECT_THROW(matmulBackward(small.data(), small.data(), small.data(), small.data(),
                                small.data(), 2, 2, huge, false, false, GradWrite::Add,
                                GradWrite::Add),
                 std::length_error);
  }
}

// A body that throws on the caller or on a worker (a scratch buffer's bad_alloc) reaches the
// caller of parallelFor, once, and leaves the threads as they were: the next job runs on all of
// them again and covers its range.
TEST(KernelsFastTest, ABodyThatThrowsEndsItsJobAndLeavesTheThreadsUsable) {
  ThreadsScope threads(3);
  // 12 chunks of 100 (3 threads x 4); the first, a middle one, the last, and every chunk.
  for (int64_t failing : {0, 5, 11, -1}) {
    bool caught = false;
    try {
      detail::parallelFor(1200, 1, [&](int64_t begin, int64_t) {
        if (failing < 0 || begin == failing * 100)
          throw std::runtime_error("chunk at " + std::to_string(begin));
      });
    } catch (const std::runtime_error &error) {
      caught = true;
      if (failing >= 0) {
        EXPECT_EQ(std::string(error.what()), "chunk at " + std::to_string(failing * 100));
      }
    }
    EXPECT_TRUE(caught) << failing;
    EXPECT_EQ(detail::availableThreads(), 3) << failing;
    std::vector<std::atomic<int>> hits(1200);
    std::atomic<int> parts{0};
    detail::parallelFor(1200, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        ++hits[size_t(i)];
      ++parts;
    });
    EXPECT_EQ(parts.load(), 12) << failing;
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](const auto &h) { return h == 1; }));
  }
}

// Each thread owns a run of a job's chunks and the others take what it leaves: whatever the
// threads, the chunks and the runs' uneven edges (7 chunks over 3 threads, fewer chunks than
// threads), every element is visited once and every chunk is counted before the job returns.
TEST(KernelsFastTest, EveryJobCoversItsRangeOnceOverTheThreadsRuns) {
  for (int64_t threads : {2, 3, 4}) {
    ThreadsScope scope(threads);
    for (int64_t n : {1, 2, 3, 7, 50, 1000})
      for (int64_t perThread : {1, 2, 4}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int64_t> parts{0};
        detail::parallelFor(
            n, 1,
            [&](int64_t begin, int64_t end) {
              for (int64_t i = begin; i < end; ++i)
                ++hits[size_t(i)];
              ++parts;
            },
            perThread);
        EXPECT_EQ(parts.load(), n > 1 ? std::min(n, threads * perThread) : 1)
            << threads << " threads, n " << n << ", " << perThread << " a thread";
        EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](const auto &h) { return h == 1; }))
            << threads << " threads, n " << n << ", " << perThread << " a thread";
      }
  }
}

TEST(KernelsFastTest, FusedBiasGeluIsTheUnfusedPairBitForBit) {
  // 60000 elements: eight chunks on two threads (Rows.h's grain is 4096 elements a chunk).
  const int64_t rows = 200, dim = 300;
  for (int64_t threads : {1, 2}) {
    ThreadsScope scope(threads);
    auto x = randomValues<float>(rows * dim, 1, 3.0), bias = randomValues<float>(dim, 2);
    auto dz = randomValues<float>(rows * dim, 3);
    std::vector<float> sum(x.size()), unfused(x.size()), fused(x.size());
    biasAddForward(sum.data(), x.data(), bias.data(), rows, dim);
    geluForward(unfused.data(), sum.data(), rows * dim);
    biasGeluForward(fused.data(), x.data(), bias.data(), rows, dim);
    EXPECT_EQ(fused, unfused);

    std::vector<float> dsum(x.size()), dxUnfused(x.size()), dxFused(x.size());
    std::vector<float> dbiasUnfused(dim, 0.5f), dbiasFused(dim, 0.5f);
    geluBackward(dsum.data(), sum.data(), dz.data(), rows * dim);
    biasAddBackward(dxUnfused.data(), dbiasUnfused.data(), dsum.data(), rows, dim);
    biasGeluBackward(dxFused.data(), dbiasFused.data(), x.data(), bias.data(), dz.data(), rows,
                     dim);
    EXPECT_EQ(dxFused, dxUnfused);
    EXPECT_EQ(dbiasFused, dbiasUnfused);
  }
}

template <typename T> void checkResidualNormFusion() {
  const int64_t rows = 33, dim = 96;
  auto a = randomValues<T>(rows * dim, 4), b = randomValues<T>(rows * dim, 5);
  auto weight = randomValues<T>(dim, 6), bias = randomValues<T>(dim, 7);
  std::vector<T> sum(a.size()), y(a.size()), fusedSum(a.size()), fusedY(a.size());
  residualAddForward(sum.data(), a.data(), b.data(), rows * dim);
  layerNormForward(y.data(), sum.data(), weight.data(), bias.data(), rows, dim, 1e-5);
  residualLayerNormForward(fusedSum.data(), fusedY.data(), a.data(), b.data(), weight.data(),
                           bias.data(), rows, dim, 1e-5);
  EXPECT_EQ(fusedSum, sum);
  EXPECT_EQ(fusedY, y);
  rmsNormForward(y.data(), sum.data(), weight.data(), rows, dim, 1e-5);
  residualRmsNormForward(fusedSum.data(), fusedY.data(), a.data(), b.data(), weight.data(), rows,
                         dim, 1e-5);
  EXPECT_EQ(fusedSum, sum);
  EXPECT_EQ(fusedY, y);
}

TEST(KernelsFastTest, FusedResidualNormIsTheUnfusedPairBitForBit) {
  checkResidualNormFusion<float>();
  checkResidualNormFusion<double>();
}

// The norms normalise rows in groups (Norm.cpp); a row's outputs and its share of the weight
// gradients are the bits of that row run alone. 7 rows: a group of four and three single
// rows; dim 45: lane sums with a tail.
template <typename T> void checkNormRowsAlone() {
  const int64_t rows = 7, dim = 45;
  const double eps = 1e-5;
  auto x = randomValues<T>(rows * dim, 8), dy = randomValues<T>(rows * dim, 9);
  auto weight = randomValues<T>(dim, 10), bias = randomValues<T>(dim, 11);
  size_t n = x.size();
  std::vector<T> y(n), dx(n), dw(dim), db(dim), rowY(n), rowDx(n), rowDw(dim), rowDb(dim);
  std::vector<T> rmsY(n), rmsDx(n), rmsDw(dim), rowRmsY(n), rowRmsDx(n), rowRmsDw(dim);
  layerNormForward(y.data(), x.data(), weight.data(), bias.data(), rows, dim, eps);
  layerNormBackward(dx.data(), dw.data(), db.data(), x.data(), weight.data(), dy.data(), rows,
                    dim, eps);
  rmsNormForward(rmsY.data(), x.data(), weight.data(), rows, dim, eps);
  rmsNormBackward(rmsDx.data(), rmsDw.data(), x.data(), weight.data(), dy.data(), rows, dim, eps);
  for (int64_t r = 0; r < rows; ++r) {
    size_t at = size_t(r * dim);
    layerNormForward(&rowY[at], &x[at], weight.data(), bias.data(), 1, dim, eps);
    layerNormBackward(&rowDx[at], rowDw.data(), rowDb.data(), &x[at], weight.data(), &dy[at], 1,
                      dim, eps);
    rmsNormForward(&rowRmsY[at], &x[at], weight.data(), 1, dim, eps);
    rmsNormBackward(&rowRmsDx[at], rowRmsDw.data(), &x[at], weight.data(), &dy[at], 1, dim, eps);
  }
  EXPECT_EQ(y, rowY);
  EXPECT_EQ(dx, rowDx);
  EXPECT_EQ(dw, rowDw); // from zero, the rows add in the same order either way
  EXPECT_EQ(db, rowDb);
  EXPECT_EQ(rmsY, rowRmsY);
  EXPECT_EQ(rmsDx, rowRmsDx);
  EXPECT_EQ(rmsDw, rowRmsDw);
}

TEST(KernelsFastTest, NormsGiveEachRowTheBitsOfThatRowAlone) {
  checkNormRowsAlone<float>();
  checkNormRowsAlone<double>();
}

// The float norms (one pass of sums, normalised in float) against the double ones at the
// float inputs, on rows far from zero as well: for layernorm, a mean of 1e4 over a spread of
// 0.1 cancels eight of a float's digits, which a pass of plain sums (E[x^2] - mean^2) or x
// minus the mean's float would lose (errors of 1e-3 of the outputs' scale, measured).
TEST(KernelsFastTest, FloatNormsAgreeWithDoubleFarFromZero) {
  const int64_t rows = 9, dim = 300;
  for (auto [mean, spread] : {std::pair{0.0, 1.0}, {5.0, 1.0}, {1e4, 0.1}, {-300.0, 1e-3}}) {
    auto x = randomValues<double>(rows * dim, 12, spread);
    for (double &value : x)
      value = double(float(mean + value));
    auto dy = randomValues<double>(rows * dim, 13), weight = randomValues<double>(dim, 14);
    auto bias = randomValues<double>(dim, 15);
    for (auto *values : {&dy, &weight, &bias})
      for (double &value : *values)
        value = double(float(value));
    std::vector<double> y(x.size()), dx(x.size()), dw(dim), db(dim);
    layerNormForward(y.data(), x.data(), weight.data(), bias.data(), rows, dim, 1e-5);
    layerNormBackward(dx.data(), dw.data(), db.data(), x.data(), weight.data(), dy.data(), rows,
                      dim, 1e-5);
    std::vector<float> xF(x.begin(), x.end()), dyF(dy.begin(), dy.end());
    std::vector<float> weightF(weight.begin(), weight.end()), biasF(bias.begin(), bias.end());
    std::vector<float> yF(x.size()), dxF(x.size()), dwF(dim), dbF(dim);
    layerNormForward(yF.data(), xF.data(), weightF.data(), biasF.data(), rows, dim, 1e-5);
    layerNormBackward(dxF.data(), dwF.data(), dbF.data(), xF.data(), weightF.data(), dyF.data(),
                      rows, dim, 1e-5);
    std::vector<double> rmsY(x.size()), rmsDx(x.size()), rmsDw(dim);
    rmsNormForward(rmsY.data(), x.data(), weight.data(), rows, dim, 1e-5);
    rmsNormBackward(rmsDx.data(), rmsDw.data(), x.data(), weight.data(), dy.data(), rows, dim,
                    1e-5);
    std::vector<float> rmsYF(x.size()), rmsDxF(x.size()), rmsDwF(dim);
    rmsNormForward(rmsYF.data(), xF.data(), weightF.data(), rows, dim, 1e-5);
    rmsNormBackward(rmsDxF.data(), rmsDwF.data(), xF.data(), weightF.data(), dyF.data(), rows,
                    dim, 1e-5);
    // A few float roundings of each output's scale (measured: 1.55e-7 at most).
    auto expectNear = [&](const std::vector<float> &got, const std::vector<double> &want,
                          const char *what) {
      double scale = 0, worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::abs(want[i]));
        worst = std::max(worst, std::abs(double(got[i]) - want[i]));
      }
      EXPECT_LT(worst, 5e-7 * scale) << what << " about " << mean << " spread " << spread;
    };
    expectNear(yF, y, "y");
    expectNear(dxF, dx, "dx");
    expectNear(dwF, dw, "dweight");
    expectNear(dbF, db, "dbias");
    expectNear(rmsYF, rmsY, "rmsnorm y");
    expectNear(rmsDxF, rmsDx, "rmsnorm dx");
    expectNear(rmsDwF, rmsDw, "rmsnorm dweight");
  }
}

TEST(KernelsFastTest, FloatGeluIsWithinRoundingOfDouble) {
  // GELU and its derivative over [-10, 10], float against the double (libm) kernels.
  const int64_t n = 20001;
  std::vector<double> x(n), dy(n, 1.0), y(n), dx(n);
  for (int64_t i = 0; i < n; ++i)
    x[size_t(i)] = -10.0 + 20.0 * double(i) / double(n - 1);
  std::vector<float> xf(x.begin(), x.end()), dyf(n, 1.0f), yf(n), dxf(n);
  geluForward(y.data(), x.data(), n);
  geluForward(yf.data(), xf.data(), n);
  geluBackward(dx.data(), x.data(), dy.data(), n);
  geluBackward(dxf.data(), xf.data(), dyf.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    // The reference at the float input, so that only the kernels' error is measured.
    double at = double(xf[size_t(i)]);
    double ref = 0.5 * at * std::erfc(-at / std::sqrt(2.0));
    double dref = 0.5 * std::erfc(-at / std::sqrt(2.0)) + at * std::exp(-0.5 * at * at) /
                                                                std::sqrt(2.0 * M_PI);
    // erfc's absolute error (1.5e-7) times x / 2, and a few roundings.
    EXPECT_NEAR(yf[size_t(i)], ref, 4e-7 * std::abs(ref) + 1e-7 * std::abs(at))
        << "gelu at " << at;
    EXPECT_NEAR(dxf[size_t(i)], dref, 1e-6 * std::abs(dref) + 2e-7) << "gelu' at " << at;
  }
}

TEST(KernelsFastTest, FloatSwigluIsWithinRoundingOfDouble) {
  // silu(g) u and both gradients over g in [-100, 100] (expf's clamps at both ends), against
  // the exact values at the float inputs.
  const int64_t n = 20001;
  std::vector<float> gate(n), up(n), dy(n), y(n), dgate(n), dup(n);
  for (int64_t i = 0; i < n; ++i) {
    gate[size_t(i)] = float(-100.0 + 200.0 * double(i) / double(n - 1));
    up[size_t(i)] = float(1.0 + 0.5 * std::sin(double(i)));
    dy[size_t(i)] = float(0.75 - 0.25 * std::cos(double(i)));
  }
  swigluForward(y.data(), gate.data(), up.data(), 1, n);
  swigluBackward(dgate.data(), dup.data(), gate.data(), up.data(), dy.data(), 1, n);
  for (size_t i = 0; i < size_t(n); ++i) {
    double g = gate[i], u = up[i], d = dy[i], s = 1.0 / (1.0 + std::exp(-g));
    double ref = g * s * u, dgRef = d * u * s * (1.0 + g * (1.0 - s)), duRef = d * g * s;
    // expf's relative error (about 1e-7) and a few roundings; below e^-87.3, the smallest
    // normal float, expf gives 0, so a sigmoid there is 0 and each result off by up to its
    // factors beside s times 1.2e-38.
    double flushed = 1.2e-38 * std::abs(g) * (std::abs(u) + std::abs(d) + std::abs(d * u));
    EXPECT_NEAR(y[i], ref, 1e-6 * std::abs(ref) + flushed) << "swiglu at " << g;
    EXPECT_NEAR(dgate[i], dgRef, 1e-6 * std::abs(dgRef) + 1e-6 * std::abs(d * u * s) + flushed)
        << "swiglu' (gate) at " << g;
    EXPECT_NEAR(dup[i], duRef, 1e-6 * std::abs(duRef) + flushed) << "swiglu' (up) at " << g;
  }
}

TEST(KernelsFastTest, FloatCrossEntropyAgreesWithDouble) {
  const int64_t seq = 3, batch = 2, vocab = 50, rows = seq * batch;
  auto logits = randomValues<double>(rows * vocab, 8, 6.0);
  std::vector<float> logitsF(logits.begin(), logits.end());
  std::vector<int64_t> labels = {1, 7, 49, 0, 20, 33};
  std::vector<double> max(rows), sum(rows), grad(logits.size());
  std::vector<float> maxF(rows), sumF(rows), gradF(logits.size());
  crossEntropyRowMax(max.data(), logits.data(), rows, vocab);
  crossEntropyRowMax(maxF.data(), logitsF.data(), rows, vocab);
  crossEntropySumExp(sum.data(), logits.data(), max.data(), rows, vocab);
  crossEntropySumExp(sumF.data(), logitsF.data(), maxF.data(), rows, vocab);
  crossEntropyBackward(grad.data(), logits.data(), labels.data(), max.data(), sum.data(), 1.0, seq,
                       batch, vocab, 0);
  crossEntropyBackward(gradF.data(), logitsF.data(), labels.data(), maxF.data(), sumF.data(), 1.0f,
                       seq, batch, vocab, 0);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_NEAR(sumF[size_t(r)], sum[size_t(r)], 1e-6 * sum[size_t(r)]);
  for (size_t i = 0; i < grad.size(); ++i)
    EXPECT_NEAR(gradF[i], grad[i], 1e-7);
}

/// parrun writes the logits' gradient over the logits (OpInterpreter::outOver): in place the
/// kernel must give the bits it gives into a fresh buffer, in fp32 (vectorised) and fp64, with
/// a shard's padding and a label on another shard.
template <typename T> void expectCrossEntropyBackwardInPlace() {
  const int64_t seq = 5, batch = 3, localVocab = 40, valid = 37, rows = seq * batch;
  const int64_t vocabOffset = 40;
  auto random = randomValues<double>(rows * localVocab, 31, 6.0);
  std::vector<T> logits(random.begin(), random.end());
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i)
    labels[size_t(i)] = vocabOffset + (i * 7) % localVocab - (i % 4 == 0 ? 41 : 0);
  std::vector<T> max(rows), sum(rows), fresh(logits.size());
  crossEntropyRowMax(max.data(), logits.data(), rows, localVocab, valid);
  crossEntropySumExp(sum.data(), logits.data(), max.data(), rows, localVocab, valid);
  crossEntropyBackward(fresh.data(), logits.data(), labels.data(), max.data(), sum.data(), T(0.5),
                       seq, batch, localVocab, vocabOffset, valid);
  std::vector<T> inPlace = logits;
  crossEntropyBackward(inPlace.data(), inPlace.data(), labels.data(), max.data(), sum.data(),
                       T(0.5), seq, batch, localVocab, vocabOffset, valid);
  for (size_t i = 0; i < fresh.size(); ++i)
    ASSERT_EQ(inPlace[i], fresh[i]) << "element " << i;
  EXPECT_NE(fresh, logits); // the gradient is not the logits: the comparison above can fail
}

TEST(KernelsFastTest, CrossEntropyBackwardInPlaceIsExact) {
  expectCrossEntropyBackwardInPlace<float>();
  expectCrossEntropyBackwardInPlace<double>();
}

TEST(KernelsFastTest, FloatFlashAttentionAgreesWithDouble) {
  // Two query tiles and a partial one, causal, grouped queries: the fp32 kernel (VecMath.h's
  // exp, float sums) within float roundings of the fp64 one.
  const int64_t seq = 150, batch = 2, heads = 4, kvHeads = 2, headDim = 16;
  const int64_t n = seq * batch * heads * headDim, nkv = n / 2, nlse = batch * heads * seq;
  auto q = randomValues<double>(n, 22, 2.0), k = randomValues<double>(nkv, 23, 2.0);
  auto v = randomValues<double>(nkv, 24), dy = randomValues<double>(n, 25);
  auto asFloat = [](const std::vector<double> &x) { return std::vector<float>(x.begin(), x.end()); };
  std::vector<float> qF = asFloat(q), kF = asFloat(k), vF = asFloat(v), dyF = asFloat(dy);
  std::vector<double> y(n), lse(nlse), dq(n), dk(nkv), dv(nkv);
  std::vector<float> yF(n), lseF(nlse), dqF(n), dkF(nkv), dvF(nkv);
  flashAttentionForward(y.data(), lse.data(), q.data(), k.data(), v.data(), seq, batch, heads,
                        kvHeads, headDim, true);
  flashAttentionForward(yF.data(), lseF.data(), qF.data(), kF.data(), vF.data(), seq, batch,
                        heads, kvHeads, headDim, true);
  flashAttentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(), y.data(),
                         lse.data(), dy.data(), seq, batch, heads, kvHeads, headDim, true);
  flashAttentionBackward(dqF.data(), dkF.data(), dvF.data(), qF.data(), kF.data(), vF.data(),
                         yF.data(), lseF.data(), dyF.data(), seq, batch, heads, kvHeads, headDim,
                         true);
  auto expectClose = [](const std::vector<float> &got, const std::vector<double> &want,
                        const char *what) {
    double scale = 0;
    for (double x : want)
      scale = std::max(scale, std::abs(x));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-5 * scale) << what << " " << i;
  };
  expectClose(yF, y, "y");
  expectClose(lseF, lse, "lse");
  expectClose(dqF, dq, "dq");
  expectClose(dkF, dk, "dk");
  expectClose(dvF, dv, "dv");
}

// parrun hands an op's kernel output memory that may hold anything (Init::Overwritten in
// Buffer.h) unless the kernel adds into it: every such kernel must write all of it. Outputs
// start as NaNs here, at shapes with odd tails (rows, lanes, tiles, key blocks); any element
// left unwritten stays NaN. 1001 rows of 45 are two chunks on two threads, the second starting
// mid-way, each ending in a group of rows short of four.
TEST(KernelsFastTest, OverwritingKernelsWriteEveryElement) {
  const int64_t rows = 1001, dim = 45, seq = 300, batch = 1, heads = 2, headDim = 8;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto fresh = [&](int64_t n) { return std::vector<float>(size_t(n), nan); };
  auto input = [](int64_t n, uint64_t seed) {
    std::vector<double> x = randomValues<double>(size_t(n), seed);
    return std::vector<float>(x.begin(), x.end());
  };
  auto expectWritten = [](const std::vector<float> &y, const char *what) {
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_FALSE(std::isnan(y[i])) << what << " element " << i << " was not written";
  };
  std::vector<float> x = input(rows * dim, 1), dy = input(rows * dim, 2), w = input(dim, 3);
  std::vector<float> b = input(dim, 4), acc(size_t(dim), 0.0f), acc2(size_t(dim), 0.0f);
  for (int64_t threads : {1, 2}) {
    ThreadsScope scope(threads);
    std::vector<float> y = fresh(rows * dim), s = fresh(rows * dim), dx = fresh(rows * dim);
    layerNormForward(y.data(), x.data(), w.data(), b.data(), rows, dim, 1e-5);
    expectWritten(y, "layernorm");
    y = fresh(rows * dim);
    residualLayerNormForward(s.data(), y.data(), x.data(), dy.data(), w.data(), b.data(), rows,
                             dim, 1e-5);
    expectWritten(s, "residual + layernorm sum");
    expectWritten(y, "residual + layernorm");
    layerNormBackward(dx.data(), acc.data(), acc2.data(), x.data(), w.data(), dy.data(), rows,
                      dim, 1e-5);
    expectWritten(dx, "layernorm_bwd");
    y = fresh(rows * dim), dx = fresh(rows * dim);
    rmsNormForward(y.data(), x.data(), w.data(), rows, dim, 1e-5);
    expectWritten(y, "rmsnorm");
    rmsNormBackward(dx.data(), acc.data(), x.data(), w.data(), dy.data(), rows, dim, 1e-5);
    expectWritten(dx, "rmsnorm_bwd");
    y = fresh(rows * dim), dx = fresh(rows * dim);
    biasGeluForward(y.data(), x.data(), b.data(), rows, dim);
    expectWritten(y, "bias + gelu");
    biasGeluBackward(dx.data(), acc.data(), x.data(), b.data(), dy.data(), rows, dim);
    expectWritten(dx, "bias + gelu_bwd");
    y = fresh(rows * dim), dx = fresh(rows * dim);
    biasAddForward(y.data(), x.data(), b.data(), rows, dim);
    expectWritten(y, "bias_add");
    biasAddBackward(dx.data(), acc.data(), dy.data(), rows, dim);
    expectWritten(dx, "bias_add_bwd");
    y = fresh(rows * dim), dx = fresh(rows * dim);
    residualAddForward(y.data(), x.data(), dy.data(), rows * dim);
    expectWritten(y, "residual_add");
    y = fresh(rows * dim);
    residualAddBackward(dx.data(), y.data(), dy.data(), rows * dim);
    expectWritten(dx, "residual_add_bwd a");
    expectWritten(y, "residual_add_bwd b");
    y = fresh(rows * dim), dx = fresh(rows * dim);
    swigluForward(y.data(), x.data(), dy.data(), rows, dim);
    expectWritten(y, "swiglu");
    swigluBackward(dx.data(), y.data(), x.data(), dy.data(), dy.data(), rows, dim);
    expectWritten(dx, "swiglu_bwd gate");
    expectWritten(y, "swiglu_bwd up");
    y = fresh(rows * rows);
    matmulForward(y.data(), x.data(), dy.data(), rows, rows, dim, false, true);
    expectWritten(y, "matmul");
    dx = fresh(rows * dim);
    std::vector<float> dw = fresh(rows * dim);
    matmulBackward(dx.data(), dw.data(), x.data(), dy.data(), y.data(), rows, rows, dim, false,
                   true, GradWrite::Overwrite, GradWrite::Overwrite);
    expectWritten(dx, "matmul_bwd da");
    expectWritten(dw, "matmul_bwd db");
    y = fresh(rows * dim), dx = fresh(rows * dim);
    geluForward(y.data(), x.data(), rows * dim);
    expectWritten(y, "gelu");
    geluBackward(dx.data(), x.data(), dy.data(), rows * dim);
    expectWritten(dx, "gelu_bwd");

    // The embedding's lookup: [seq 91, batch 11] ids of which a shard of 30 rows holds some.
    const int64_t tokens = 91, sequences = 11, shardRows = 30, shardOffset = 30;
    std::vector<int64_t> ids(size_t(tokens * sequences));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = int64_t(i * 37 % 100);
    std::vector<float> table = input(shardRows * dim, 9);
    y = fresh(tokens * sequences * dim);
    embeddingForward(y.data(), ids.data(), table.data(), tokens, sequences, dim, shardOffset,
                     shardRows);
    expectWritten(y, "embedding");
    std::vector<float> positions = input(tokens * dim, 10), z = fresh(tokens * sequences * dim);
    positionEmbeddingForward(z.data(), y.data(), positions.data(), tokens, sequences, dim);
    expectWritten(z, "position_embedding");
    dx = fresh(tokens * sequences * dim);
    std::vector<float> dpositions(size_t(tokens * dim), 0.0f);
    positionEmbeddingBackward(dx.data(), dpositions.data(), z.data(), tokens, sequences, dim);
    expectWritten(dx, "position_embedding_bwd");

    // The loss's gradient over [91 x 11 rows, a shard of 45 columns of which 41 are valid].
    std::vector<float> logits = input(tokens * sequences * dim, 11);
    std::vector<float> rowMax = fresh(tokens * sequences), rowSum = fresh(tokens * sequences);
    crossEntropyRowMax(rowMax.data(), logits.data(), tokens * sequences, dim, dim - 4);
    expectWritten(rowMax, "cross_entropy row max");
    crossEntropySumExp(rowSum.data(), logits.data(), rowMax.data(), tokens * sequences, dim,
                       dim - 4);
    expectWritten(rowSum, "cross_entropy row sum");
    dx = fresh(tokens * sequences * dim);
    crossEntropyBackward(dx.data(), logits.data(), ids.data(), rowMax.data(), rowSum.data(), 0.5f,
                         tokens, sequences, dim, shardOffset, dim - 4);
    expectWritten(dx, "cross_entropy_bwd");

    const int64_t n = seq * batch * heads * headDim;
    std::vector<float> q = input(n, 5), k = input(n, 6), v = input(n, 7), dyA = input(n, 8);
    std::vector<float> rotated = fresh(n), unrotated = fresh(n);
    ropeForward(rotated.data(), q.data(), seq, batch, heads, headDim, 10000.0, 3);
    expectWritten(rotated, "rope");
    ropeBackward(unrotated.data(), rotated.data(), seq, batch, heads, headDim, 10000.0, 3);
    expectWritten(unrotated, "rope_bwd");
    for (bool causal : {true, false}) {
      std::vector<float> out = fresh(n), lse = fresh(batch * heads * seq);
      flashAttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), seq, batch,
                            heads, heads, headDim, causal);
      expectWritten(out, "flash attention");
      expectWritten(lse, "flash attention lse");
      std::vector<float> dq = fresh(n), dk = fresh(n), dv = fresh(n);
      flashAttentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(),
                             out.data(), lse.data(), dyA.data(), seq, batch, heads, heads, headDim,
                             causal);
      expectWritten(dq, "flash attention dq");
      expectWritten(dk, "flash attention dk");
      expectWritten(dv, "flash attention dv");
      std::vector<float> probs = fresh(batch * heads * seq * seq);
      out = fresh(n);
      attentionForward(out.data(), probs.data(), q.data(), k.data(), v.data(), seq, batch, heads,
                       heads, headDim, causal);
      expectWritten(out, "attention");
      expectWritten(probs, "attention probabilities");
      dq = fresh(n), dk = fresh(n), dv = fresh(n);
      attentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(),
                        probs.data(), dyA.data(), seq, batch, heads, heads, headDim, causal);
      expectWritten(dq, "attention dq");
      expectWritten(dk, "attention dk");
      expectWritten(dv, "attention dv");
    }
  }
}

} // namespace

namespace {
TEST(KernelsFastTest, GemmsCutOverThreadsAgreeToRounding) {
  // OpenBLAS's blocking depends on the shape of each call, so the cut GEMMs agree with the
  // uncut one to rounding, not bitwise (as OpenBLAS's own threads did).
  const int64_t m = 517, n = 300, k = 130;
  auto a = randomValues<float>(m * k, 15), b = randomValues<float>(k * n, 16);
  std::vector<std::vector<float>> outputs;
  for (int64_t threads : {1, 2, 3}) {
    ThreadsScope scope(threads);
    std::vector<float> c(m * n), db(b.size());
    matmulForward(c.data(), a.data(), b.data(), m, n, k, false, false);
    matmulBackward(static_cast<float *>(nullptr), db.data(), a.data(), b.data(), c.data(), m, n, k,
                   false, false, GradWrite::Overwrite, GradWrite::Overwrite);
    c.insert(c.end(), db.begin(), db.end());
    outputs.push_back(c);
  }
  // Sums of hundreds of terms that cancel: rounding relative to the largest output.
  float scale = 0;
  for (float value : outputs[0])
    scale = std::max(scale, std::abs(value));
  for (size_t t = 1; t < outputs.size(); ++t)
    for (size_t i = 0; i < outputs[0].size(); ++i)
      ASSERT_NEAR(outputs[t][i], outputs[0][i], 1e-6 * scale) << i;
}
} // namespace
