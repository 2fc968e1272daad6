//===- RingAttentionTest.cpp - blocks of ring attention add up to attention ===//
//
// Ring attention splits a rank's queries and keys into chunks and runs attention block by
// block (RingAttention.cpp): the merged blocks must give attention's output, and the blocks'
// backward attention's gradients, to rounding. The sequence is cut as a cp = 2 ring cuts it:
// rows [0, c) and [c, 2c), chunk 0 and chunk 1 of one rank at cp rank 0 (their causal pairs:
// (0, 0) diagonal, (1, 0) full, (1, 1) diagonal).
//
//===----------------------------------------------------------------------===//

#include "RandomValues.h"
#include "parc/Runtime/Kernels.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

using namespace parc::runtime::cpu;
using parc::test::randomVec;

namespace {

using Vec = std::vector<double>;

struct Shape {
  int64_t chunk, batch, heads, kvHeads, headDim;
  int64_t qRow() const { return batch * heads * headDim; }
  int64_t kvRow() const { return batch * kvHeads * headDim; }
};

/// One block of the two chunks: query chunk q against key chunk kv.
struct Pair {
  int q, kv;
  bool causal;
};

void checkBlocksAddUp(const Shape &s) {
  SCOPED_TRACE(testing::Message() << "heads " << s.heads << " kv_heads " << s.kvHeads);
  std::mt19937_64 rng(31 + s.heads + s.kvHeads);
  const int64_t seq = 2 * s.chunk, c = s.chunk;
  Vec q = randomVec(seq * s.qRow(), rng), k = randomVec(seq * s.kvRow(), rng);
  Vec v = randomVec(k.size(), rng), dy = randomVec(q.size(), rng);
  Vec y(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  Vec probs(s.batch * s.heads * seq * seq);
  attentionForward(y.data(), probs.data(), q.data(), k.data(), v.data(), seq, s.batch, s.heads,
                   s.kvHeads, s.headDim, true);
  attentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(), probs.data(),
                    dy.data(), seq, s.batch, s.heads, s.kvHeads, s.headDim, true);

  const Pair pairs[] = {{0, 0, true}, {1, 0, false}, {1, 1, true}};
  auto qAt = [&](Vec &m, int h) { return m.data() + h * c * s.qRow(); };
  auto kvAt = [&](Vec &m, int h) { return m.data() + h * c * s.kvRow(); };
  const int64_t lseSize = s.batch * s.heads * c;
  Vec blockY(q.size()), lse(2 * lseSize), partY(c * s.qRow()), partLse(lseSize);
  bool first[2] = {true, true};
  for (const Pair &p : pairs) {
    double *yOut = first[p.q] ? qAt(blockY, p.q) : partY.data();
    double *lseOut = first[p.q] ? lse.data() + p.q * lseSize : partLse.data();
    attentionBlockForward(yOut, lseOut, qAt(q, p.q), kvAt(k, p.kv), kvAt(v, p.kv), c, c, s.batch,
                          s.heads, s.kvHeads, s.headDim, p.causal);
    if (!first[p.q])
      attentionMerge(qAt(blockY, p.q), lse.data() + p.q * lseSize, qAt(blockY, p.q),
                     lse.data() + p.q * lseSize, partY.data(), partLse.data(), c, s.batch,
                     s.heads, s.headDim);
    first[p.q] = false;
  }
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(blockY[i], y[i], 1e-13) << "y[" << i << "]";

  Vec sumQ(q.size(), 0.0), sumK(k.size(), 0.0), sumV(v.size(), 0.0);
  Vec partQ(c * s.qRow()), partK(c * s.kvRow()), partV(c * s.kvRow());
  for (const Pair &p : pairs) {
    attentionBlockBackward(partQ.data(), partK.data(), partV.data(), qAt(q, p.q), kvAt(k, p.kv),
                           kvAt(v, p.kv), qAt(blockY, p.q), lse.data() + p.q * lseSize,
                           qAt(dy, p.q), c, c, s.batch, s.heads, s.kvHeads, s.headDim, p.causal);
    for (int64_t i = 0; i < c * s.qRow(); ++i)
      qAt(sumQ, p.q)[i] += partQ[size_t(i)];
    for (int64_t i = 0; i < c * s.kvRow(); ++i) {
      kvAt(sumK, p.kv)[i] += partK[size_t(i)];
      kvAt(sumV, p.kv)[i] += partV[size_t(i)];
    }
  }
  for (auto [got, want, name] : {std::tuple{&sumQ, &dq, "dq"}, {&sumK, &dk, "dk"},
                                 {&sumV, &dv, "dv"}})
    for (size_t i = 0; i < want->size(); ++i)
      EXPECT_NEAR((*got)[i], (*want)[i], 1e-12) << name << "[" << i << "]";
}

TEST(RingAttention, BlocksMergeToAttentionAndTheirGradientsAddUp) {
  checkBlocksAddUp({3, 2, 2, 2, 4});
  checkBlocksAddUp({4, 1, 4, 2, 8}); // grouped-query attention
  checkBlocksAddUp({2, 2, 4, 1, 2});
}

TEST(RingAttention, MergeIsTheSoftmaxOverBothBlocks) {
  // One query, one key per block: the merge weights the two values by their softmax.
  double yA = 2, lseA = std::log(1.0), yB = -1, lseB = std::log(3.0), y, lse;
  attentionMerge(&y, &lse, &yA, &lseA, &yB, &lseB, 1, 1, 1, 1);
  EXPECT_NEAR(lse, std::log(4.0), 1e-15);
  EXPECT_NEAR(y, 0.25 * 2 + 0.75 * -1, 1e-15);
}

TEST(RingAttention, RopeOffsetContinuesThePositions) {
  std::mt19937_64 rng(41);
  const int64_t seq = 6, batch = 2, heads = 2, headDim = 4;
  Vec x = randomVec(seq * batch * heads * headDim, rng), whole(x.size()), tail(x.size() / 2);
  ropeForward(whole.data(), x.data(), seq, batch, heads, headDim, 10000.0);
  ropeForward(tail.data(), x.data() + x.size() / 2, seq / 2, batch, heads, headDim, 10000.0, 3);
  for (size_t i = 0; i < tail.size(); ++i)
    EXPECT_EQ(tail[i], whole[x.size() / 2 + i]);
}

} // namespace
