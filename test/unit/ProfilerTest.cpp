//===- ProfilerTest.cpp - `parrun --profile`'s counts, exchange and table --===//
//
// The floating-point operations each GEMM op is credited with (the table's GFLOP/s are
// these over the measured time), the keys of fused ops, the sum of the ranks' profiles and
// the table's columns, on hand-made ops and times. test/lit/runtime/profile.test runs the
// flag on compiled plans.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Profiler.h"

#include "llvm/ADT/StringExtras.h"

#include "gtest/gtest.h"

#include <map>

using namespace parc;
using namespace parc::runtime;
using plan::OpKind;

namespace {

plan::Op makeOp(OpKind kind, std::map<std::string, plan::AttrValue> attrs = {},
                size_t inputs = 0) {
  plan::Op op;
  op.kind = kind;
  op.attrs = std::move(attrs);
  for (size_t i = 0; i < inputs; ++i)
    op.inputs.push_back("in" + std::to_string(i));
  return op;
}

double flopsOf(const plan::Op &op, std::vector<std::vector<int64_t>> shapes) {
  return opFlops(op, [&](size_t i) {
    return i < shapes.size() ? shapes[i] : std::vector<int64_t>{};
  });
}

TEST(OpFlops, AMatMulIsTwoMnkAndItsBackwardTwoProducts) {
  // a [4, 3, 5] is 12 rows of k = 5; b [5, 7]: 12 x 7 x 5 multiply-adds.
  plan::Op plain = makeOp(OpKind::MatMul, {{"trans_a", false}, {"trans_b", false}});
  EXPECT_EQ(flopsOf(plain, {{4, 3, 5}, {5, 7}}), 2.0 * 12 * 7 * 5);
  plan::Op transB = makeOp(OpKind::MatMul, {{"trans_a", false}, {"trans_b", true}});
  EXPECT_EQ(flopsOf(transB, {{4, 3, 5}, {7, 5}}), 2.0 * 12 * 7 * 5);
  // trans_a: a is [k, m].
  plan::Op transA = makeOp(OpKind::MatMul, {{"trans_a", true}, {"trans_b", false}});
  EXPECT_EQ(flopsOf(transA, {{5, 12}, {5, 7}}), 2.0 * 12 * 7 * 5);
  plan::Op backward = makeOp(OpKind::MatMulBwd, {{"trans_a", false}, {"trans_b", false}});
  EXPECT_EQ(flopsOf(backward, {{4, 3, 5}, {5, 7}}), 4.0 * 12 * 7 * 5);
  // Shapes the reader would have refused count nothing rather than a wrong rate.
  EXPECT_EQ(flopsOf(plain, {{4, 3, 5}, {5, 7, 1}}), 0);
}

TEST(OpFlops, AttentionCountsItsProductsAndFlashRecomputesTheScores) {
  // q [seq 8, batch 2, hidden 16]: each product is 2 x seq x seq x batch x hidden.
  double product = 2.0 * 8 * 8 * 2 * 16;
  auto attention = [](OpKind kind, bool flash) {
    return makeOp(kind, {{"causal", true}, {"flash", flash}, {"heads", int64_t(4)},
                         {"kv_heads", int64_t(4)}});
  };
  std::vector<std::vector<int64_t>> q = {{8, 2, 16}};
  EXPECT_EQ(flopsOf(attention(OpKind::Attention, true), q), 2 * product);
  EXPECT_EQ(flopsOf(attention(OpKind::Attention, false), q), 2 * product);
  // dv, dP, dq, dk from the kept probabilities; flash attention first recomputes q k^T.
  EXPECT_EQ(flopsOf(attention(OpKind::AttentionBwd, false), q), 4 * product);
  EXPECT_EQ(flopsOf(attention(OpKind::AttentionBwd, true), q), 5 * product);
}

TEST(OpFlops, ExpertsCountEachRowAgainstOneWeightAndOtherOpsNothing) {
  // 10 rows of 4 against [experts 3, out 6, in 4]: each row meets one expert.
  EXPECT_EQ(flopsOf(makeOp(OpKind::ExpertMatMul), {{10, 4}, {10}, {3, 6, 4}}), 2.0 * 10 * 6 * 4);
  EXPECT_EQ(flopsOf(makeOp(OpKind::ExpertMatMulBwd), {{10, 4}, {10}, {3, 6, 4}}),
            4.0 * 10 * 6 * 4);
  EXPECT_EQ(flopsOf(makeOp(OpKind::GELU), {{10, 4}}), 0);
}

TEST(ProfileKey, AFusedPairIsKeyedByBothKinds) {
  EXPECT_EQ(profileKey(makeOp(OpKind::GELU, {}, 1)), "gelu");
  EXPECT_EQ(profileKey(makeOp(OpKind::GELU, {}, 2)), "gelu+bias_add");
  EXPECT_EQ(profileKey(makeOp(OpKind::GELUBwd, {}, 3)), "gelu_bwd+bias_add");
  EXPECT_EQ(profileKey(makeOp(OpKind::LayerNorm, {}, 3)), "layernorm");
  EXPECT_EQ(profileKey(makeOp(OpKind::LayerNorm, {}, 4)), "layernorm+residual_add");
  EXPECT_EQ(profileKey(makeOp(OpKind::RMSNorm, {}, 3)), "rmsnorm+residual_add");
}

/// The columns after `name` on its row of the table.
std::vector<std::string> rowOf(llvm::StringRef table, llvm::StringRef name) {
  llvm::SmallVector<llvm::StringRef, 16> lines;
  table.split(lines, '\n');
  for (llvm::StringRef line : lines) {
    llvm::StringRef rest = line.trim();
    if (!rest.consume_front(name) || !rest.startswith(" "))
      continue;
    llvm::SmallVector<llvm::StringRef, 8> fields;
    llvm::SplitString(rest, fields);
    return {fields.begin(), fields.end()};
  }
  return {};
}

TEST(OpProfile, TheRanksProfilesAddUpAndTheTableSharesTheStep) {
  // Two ranks of two 10 ms steps: a 4 ms matmul of 0.4 GFLOP and a 0.5 ms gelu per step each.
  OpProfile rank[2];
  for (OpProfile &profile : rank)
    for (int step = 0; step < 2; ++step) {
      profile.add("matmul", 0.004, 4e8);
      profile.add("gelu", 0.0005);
      profile.add("gelu", 0.0005);
      profile.addStep(0.010);
    }
  OpProfile sum = OpProfile::merge({rank[0].encode(), rank[1].encode()});
  EXPECT_EQ(sum.steps(), 2); // the same steps on every rank, not their count over the ranks
  ASSERT_EQ(sum.entries().size(), 2u);
  const OpProfile::Entry &matmul = sum.entries().at("matmul");
  EXPECT_EQ(matmul.calls, 4);
  EXPECT_NEAR(matmul.seconds, 0.016, 1e-12);
  EXPECT_NEAR(matmul.flops, 1.6e9, 1e-3);
  EXPECT_EQ(sum.entries().at("gelu").calls, 8);

  std::string table;
  llvm::raw_string_ostream os(table);
  sum.print(os, 2, 1);
  EXPECT_NE(table.find("profile  2 steps, 2 ranks of 1 thread: time per step by op kind "
                       "(rank-ms: summed over the ranks)"),
            std::string::npos)
      << table;
  // calls/step, rank-ms/step, share of the step, GFLOP/s.
  EXPECT_EQ(rowOf(table, "matmul"), (std::vector<std::string>{"2.0", "8.000", "40.0%", "100.0"}));
  EXPECT_EQ(rowOf(table, "gelu"), (std::vector<std::string>{"4.0", "2.000", "10.0%", "-"}));
  EXPECT_EQ(rowOf(table, "(outside ops)"),
            (std::vector<std::string>{"0.0", "10.000", "50.0%", "-"}));
  // Like every row's, the step's rate is per rank-second: 1.6 GFLOP over 40 rank-ms.
  EXPECT_EQ(rowOf(table, "step"), (std::vector<std::string>{"1.0", "20.000", "100.0%", "40.0"}));
  // Rows by time, the longest first.
  EXPECT_LT(table.find("matmul"), table.find("gelu"));
}

TEST(OpProfile, OneRankSaysSoAndANoisyLineIsIgnored) {
  OpProfile profile;
  profile.add("embedding", 0.001);
  profile.addStep(0.002);
  OpProfile sum = OpProfile::merge({profile.encode() + "garbage line\n"});
  std::string table;
  llvm::raw_string_ostream os(table);
  sum.print(os, 1, 2);
  EXPECT_NE(table.find("profile  1 step, 1 rank of 2 threads: time per step by op kind\n"),
            std::string::npos)
      << table;
  EXPECT_EQ(rowOf(table, "embedding"), (std::vector<std::string>{"1.0", "1.000", "50.0%", "-"}));
  EXPECT_TRUE(rowOf(table, "garbage").empty());
}

} // namespace
