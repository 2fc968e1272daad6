//===- KernelsThreadsTest.cpp - CPU kernels: the same bits on any number of threads ---===//
//
// Every kernel that runs on the kernel threads (Parallel.h) gives, in fp32 and fp64, the bits
// it gives on one thread (where every parallelFor runs its whole range inline, the serial
// loop) on two and three; the sums over rows into weights (the embeddings' gradients) equal a
// plain serial loop. The shapes are large enough that every kernel is cut into several chunks.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "../../runtime/kernels/cpu/Parallel.h"
#include "RandomValues.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

using namespace parc::runtime;
using namespace parc::runtime::cpu;
using parc::test::randomValues;

namespace {

/// Appends every vector to the first.
template <typename T> std::vector<T> joined(std::initializer_list<const std::vector<T> *> parts) {
  std::vector<T> all;
  for (const std::vector<T> *part : parts)
    all.insert(all.end(), part->begin(), part->end());
  return all;
}

/// Runs `kernel` on 1, 2 and 3 threads and expects the same bits each time; returns them.
template <typename Kernel> auto sameOnAnyThreads(const char *what, Kernel kernel) {
  int64_t saved = kernelThreads();
  std::vector<decltype(kernel())> outputs;
  for (int64_t threads : {1, 2, 3}) {
    setKernelThreads(threads);
    outputs.push_back(kernel());
  }
  setKernelThreads(saved);
  EXPECT_FALSE(outputs[0].empty()) << what;
  EXPECT_EQ(outputs[0], outputs[1]) << what << " at 2 threads";
  EXPECT_EQ(outputs[0], outputs[2]) << what << " at 3 threads";
  return outputs[0];
}

// Tokens and a hidden size that cut into several chunks of rows and of columns.
constexpr int64_t seq = 103, batch = 10, hidden = 136, rows = seq * batch, vocab = 97;

template <typename T> void checkEmbeddings() {
  std::vector<int64_t> ids(rows);
  std::mt19937_64 rng(1);
  for (int64_t &id : ids)
    id = int64_t(rng() % (vocab + 20)); // some outside this shard
  auto weight = randomValues<T>(vocab * hidden, 2), pos = randomValues<T>(seq * hidden, 3);
  auto x = randomValues<T>(rows * hidden, 4), dy = randomValues<T>(rows * hidden, 5);
  sameOnAnyThreads("embedding forwards", [&] {
    std::vector<T> y(rows * hidden), z(rows * hidden);
    embeddingForward(y.data(), ids.data(), weight.data(), seq, batch, hidden, 5, vocab - 5);
    positionEmbeddingForward(z.data(), x.data(), pos.data(), seq, batch, hidden);
    return joined<T>({&y, &z});
  });
  auto grads = sameOnAnyThreads("embedding backwards", [&] {
    std::vector<T> dweight(weight), dx(rows * hidden), dpos(pos);
    embeddingBackward(dweight.data(), ids.data(), dy.data(), seq, batch, hidden, 5, vocab - 5);
    positionEmbeddingBackward(dx.data(), dpos.data(), dy.data(), seq, batch, hidden);
    return joined<T>({&dweight, &dx, &dpos});
  });
  // The serial loops: every weight row's column added over the tokens in token order.
  std::vector<T> dweight(weight), dpos(pos);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t b = 0; b < batch; ++b) {
      int64_t row = ids[b * seq + t] - 5, r = t * batch + b;
      for (int64_t i = 0; i < hidden; ++i) {
        if (row >= 0 && row < vocab - 5)
          dweight[row * hidden + i] += dy[r * hidden + i];
        dpos[t * hidden + i] += dy[r * hidden + i];
      }
    }
  EXPECT_EQ(std::vector<T>(grads.begin(), grads.begin() + vocab * hidden), dweight);
  EXPECT_EQ(std::vector<T>(grads.end() - seq * hidden, grads.end()), dpos);
}

template <typename T> void checkNorms() {
  auto a = randomValues<T>(rows * hidden, 6), b = randomValues<T>(rows * hidden, 7);
  auto dy = randomValues<T>(rows * hidden, 8);
  auto weight = randomValues<T>(hidden, 9), bias = randomValues<T>(hidden, 10);
  sameOnAnyThreads("norm forwards", [&] {
    std::vector<T> y(a.size()), z(a.size()), sum(a.size()), w(a.size()), u(a.size());
    layerNormForward(y.data(), a.data(), weight.data(), bias.data(), rows, hidden, 1e-5);
    rmsNormForward(z.data(), a.data(), weight.data(), rows, hidden, 1e-5);
    residualLayerNormForward(sum.data(), w.data(), a.data(), b.data(), weight.data(), bias.data(),
                             rows, hidden, 1e-5);
    residualRmsNormForward(sum.data(), u.data(), a.data(), b.data(), weight.data(), rows, hidden,
                           1e-5);
    return joined<T>({&y, &z, &sum, &w, &u});
  });
  sameOnAnyThreads("norm backwards", [&] {
    std::vector<T> dx(a.size()), dz(a.size()), dweight(hidden, T(0.5)), dbias(hidden, T(0.25));
    std::vector<T> drms(hidden, T(0.5));
    layerNormBackward(dx.data(), dweight.data(), dbias.data(), a.data(), weight.data(), dy.data(),
                      rows, hidden, 1e-5);
    rmsNormBackward(dz.data(), drms.data(), a.data(), weight.data(), dy.data(), rows, hidden,
                    1e-5);
    return joined<T>({&dx, &dz, &dweight, &dbias, &drms});
  });
}

template <typename T> void checkElementwise() {
  const int64_t n = rows * hidden;
  auto x = randomValues<T>(n, 11, 3.0), y0 = randomValues<T>(n, 12), dy = randomValues<T>(n, 13);
  auto bias = randomValues<T>(hidden, 14);
  sameOnAnyThreads("elementwise forwards", [&] {
    std::vector<T> g(n), bg(n), ba(n), ra(n), sw(n);
    geluForward(g.data(), x.data(), n);
    biasGeluForward(bg.data(), x.data(), bias.data(), rows, hidden);
    biasAddForward(ba.data(), x.data(), bias.data(), rows, hidden);
    residualAddForward(ra.data(), x.data(), y0.data(), n);
    swigluForward(sw.data(), x.data(), y0.data(), rows, hidden);
    return joined<T>({&g, &bg, &ba, &ra, &sw});
  });
  sameOnAnyThreads("elementwise backwards", [&] {
    std::vector<T> g(n), bg(n), ba(n), da(n), db(n), dgate(n), dup(n);
    std::vector<T> dbias1(hidden, T(1)), dbias2(hidden, T(-1));
    geluBackward(g.data(), x.data(), dy.data(), n);
    biasGeluBackward(bg.data(), dbias1.data(), x.data(), bias.data(), dy.data(), rows, hidden);
    biasAddBackward(ba.data(), dbias2.data(), dy.data(), rows, hidden);
    residualAddBackward(da.data(), db.data(), dy.data(), n);
    swigluBackward(dgate.data(), dup.data(), x.data(), y0.data(), dy.data(), rows, hidden);
    return joined<T>({&g, &bg, &ba, &da, &db, &dgate, &dup, &dbias1, &dbias2});
  });
}

template <typename T> void checkRopeAndCrossEntropy() {
  const int64_t heads = 4, headDim = 34, n = rows * heads * headDim;
  auto x = randomValues<T>(n, 15);
  sameOnAnyThreads("rope", [&] {
    std::vector<T> y(n), dx(n);
    ropeForward(y.data(), x.data(), seq, batch, heads, headDim, 10000.0, 3);
    ropeBackward(dx.data(), y.data(), seq, batch, heads, headDim, 10000.0, 3);
    return joined<T>({&y, &dx});
  });
  const int64_t localVocab = 160;
  auto logits = randomValues<T>(rows * localVocab, 16, 4.0);
  std::vector<int64_t> labels(rows);
  std::mt19937_64 rng(17);
  for (int64_t &label : labels)
    label = int64_t(rng() % 300);
  sameOnAnyThreads("cross entropy", [&] {
    std::vector<T> rowMax(rows), rowSum(rows), target(rows), dlogits(logits.size());
    crossEntropyRowMax(rowMax.data(), logits.data(), rows, localVocab, 150);
    crossEntropySumExp(rowSum.data(), logits.data(), rowMax.data(), rows, localVocab, 150);
    crossEntropyTargetLogit(target.data(), logits.data(), labels.data(), seq, batch, localVocab,
                            40);
    std::vector<T> loss{crossEntropyLoss(rowMax.data(), rowSum.data(), target.data(), rows)};
    crossEntropyBackward(dlogits.data(), logits.data(), labels.data(), rowMax.data(),
                         rowSum.data(), T(0.5), seq, batch, localVocab, 40, 150);
    return joined<T>({&rowMax, &rowSum, &target, &loss, &dlogits});
  });
}

template <typename T> void checkOptimizers() {
  const int64_t n = 200003;
  auto param = randomValues<T>(n, 18), grad = randomValues<T>(n, 19);
  sameOnAnyThreads("optimizers", [&] {
    std::vector<T> p(param), m(n), v(n), q(param), buffer(n), g(grad);
    AdamWConfig adam;
    adam.weightDecay = 0.1;
    for (adam.step = 1; adam.step <= 2; ++adam.step)
      adamwStep(p.data(), grad.data(), m.data(), v.data(), n, adam);
    SGDConfig sgd;
    sgd.momentum = 0.9;
    sgd.weightDecay = 0.01;
    sgdStep(q.data(), grad.data(), buffer.data(), n, sgd);
    scale(g.data(), n, 0.75);
    std::vector<T> squares{T(squaredSum(grad.data(), n))};
    return joined<T>({&p, &m, &v, &q, &buffer, &g, &squares});
  });
}

template <typename T> void checkAttention() {
  const int64_t aSeq = 150, aBatch = 2, heads = 4, kvHeads = 2, headDim = 16;
  const int64_t n = aSeq * aBatch * heads * headDim, nkv = n / 2;
  auto q = randomValues<T>(n, 20), k = randomValues<T>(nkv, 21), v = randomValues<T>(nkv, 22);
  auto dy = randomValues<T>(n, 23);
  for (bool flash : {false, true})
    sameOnAnyThreads(flash ? "flash attention" : "attention", [&] {
      std::vector<T> y(n), dq(n), dk(nkv), dv(nkv);
      std::vector<T> saved(flash ? aBatch * heads * aSeq : aBatch * heads * aSeq * aSeq);
      if (flash) {
        flashAttentionForward(y.data(), saved.data(), q.data(), k.data(), v.data(), aSeq, aBatch,
                              heads, kvHeads, headDim, true);
        flashAttentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(),
                               y.data(), saved.data(), dy.data(), aSeq, aBatch, heads, kvHeads,
                               headDim, true);
      } else {
        attentionForward(y.data(), saved.data(), q.data(), k.data(), v.data(), aSeq, aBatch,
                         heads, kvHeads, headDim, true);
        attentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(),
                          saved.data(), dy.data(), aSeq, aBatch, heads, kvHeads, headDim, true);
      }
      return joined<T>({&y, &saved, &dq, &dk, &dv});
    });
}

TEST(KernelsThreadsTest, EmbeddingsGiveTheSerialBitsOnAnyThreads) {
  checkEmbeddings<float>();
  checkEmbeddings<double>();
}

TEST(KernelsThreadsTest, NormsGiveTheSameBitsOnAnyThreads) {
  checkNorms<float>();
  checkNorms<double>();
}

TEST(KernelsThreadsTest, ElementwiseKernelsGiveTheSameBitsOnAnyThreads) {
  checkElementwise<float>();
  checkElementwise<double>();
}

TEST(KernelsThreadsTest, RopeAndCrossEntropyGiveTheSameBitsOnAnyThreads) {
  checkRopeAndCrossEntropy<float>();
  checkRopeAndCrossEntropy<double>();
}

TEST(KernelsThreadsTest, OptimizersGiveTheSameBitsOnAnyThreads) {
  checkOptimizers<float>();
  checkOptimizers<double>();
}

TEST(KernelsThreadsTest, AttentionGivesTheSameBitsOnAnyThreads) {
  checkAttention<float>();
  checkAttention<double>();
}

} // namespace
