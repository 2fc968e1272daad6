//===- PlanVerifierTest.cpp - Shapes, roles and limits of rank plans ------===//
//
// The checks that keep a hostile plan from reaching a kernel (PlanShapes.cpp, the roles of
// OpInfo) and from making the verifier itself run without bound (parc/Support/Limits.h), on
// the hand-built stage-0 plan of PlanTestSupport.h.
//
//===----------------------------------------------------------------------===//
#include "PlanTestSupport.h"
#include "parc/Support/Limits.h"

#include <gtest/gtest.h>

using namespace parc::plan;
using namespace parc::plan::testing;
namespace limits = parc::limits;

namespace {

std::string verdict(const RankPlan &plan) {
  llvm::Error error = verifyRankPlan(plan);
  return error ? llvm::toString(std::move(error)) : "accepted";
}

TEST(PlanVerifier, OperandShapesFollowTheOpKind) {
  RankPlan plan = stageZeroPlan();
  plan.chunks[0].tensors["ln1"].shape = {8, 1, 15};
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].forward[3].outputs[0]\": 'ln1' has "
                           "shape [8, 1, 15]; expected [8, 1, 16] (the shape of input 0, 'x0')");
  plan = stageZeroPlan();
  plan.chunks[0].tensors["qkv"].shape = {8, 1, 20};
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].forward[4].outputs[0]\": 'qkv' has "
                           "shape [8, 1, 20]; expected [8, 1, 24] (op(a) op(b) of the inputs)");
  plan = stageZeroPlan();
  plan.chunks[0].tensors["k"].shape = {8, 1, 4};
  plan.chunks[0].tensors["q"].shape = {8, 1, 12};
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].forward[6].inputs[1]\": 'k' has shape "
                           "[8, 1, 4]; expected [8, 1, 12] ([seq, batch, kv_heads x head_dim] of "
                           "the query's head size)");
  plan = stageZeroPlan();
  plan.chunks[0].tensors["k.grad"].shape = {8, 1, 4};
  plan.chunks[0].tensors["q.grad"].shape = {8, 1, 12};
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].backward[2].outputs[0]\": 'q.grad' has "
                           "shape [8, 1, 12]; expected [8, 1, 8] (the shape of input 0, 'q')");
  plan = stageZeroPlan();
  plan.chunks[0].forward[0].attrs["vocab_offset"] = int64_t(200);
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].forward[0].attrs.vocab_offset\": rows "
                           "[200, 200 + 128) of the embedding shard lie outside the padded "
                           "vocabulary of 256");
}

TEST(PlanVerifier, SplitPartsTileTheWhole) {
  RankPlan plan = stageZeroPlan();
  plan.chunks[0].tensors["v"].shape = {8, 1, 4};
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].forward[5].outputs\": the parts cover "
                           "20 of the 24 along dim 2 of input 0, 'qkv'");
  plan = stageZeroPlan();
  plan.chunks[0].tensors["v"].shape = {8, 2, 8};
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].forward[5].outputs[2]\": 'v' has shape "
                           "[8, 2, 8]; expected [8, 1, 8] (a part of input 0, 'qkv' along dim 2)");
}

TEST(PlanVerifier, RolesCatchSwappedOperands) {
  RankPlan plan = stageZeroPlan();
  std::swap(plan.chunks[0].backward[1].inputs[0], plan.chunks[0].backward[1].inputs[2]);
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].backward[1].inputs[0]\": 'proj.grad' is "
                           "a gradient, where 'matmul_bwd' takes a value (an activation or a "
                           "parameter); are the inputs swapped?");
  plan = stageZeroPlan();
  std::swap(plan.chunks[0].forward[3].inputs[0], plan.chunks[0].forward[3].inputs[1]);
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].forward[3].inputs[1]\": 'x0' is not a "
                           "parameter, where 'layernorm' takes one (a weight this rank owns)");
  plan = stageZeroPlan();
  plan.chunks[0].backward[7].inputs[1] = "x0";
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].backward[7].inputs[1]\": 'x0' is a value "
                           "but input 0 is a gradient; 'residual_add' combines either values or "
                           "gradients");
  plan = stageZeroPlan();
  plan.chunks[0].backward[1].outputs[1] = "block.0.attn.qkv.weight.grad";
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].backward[1].outputs[1]\": 'matmul_bwd' "
                           "writes the gradient of input 1, 'block.0.attn.proj.weight', here: "
                           "expected 'block.0.attn.proj.weight.grad' or a tensor, got the "
                           "parameter gradient 'block.0.attn.qkv.weight.grad'");
  plan = stageZeroPlan();
  plan.chunks[0].forward[2].inputs[0] = "tokens";
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].forward[2].inputs[0]\": 'tokens' holds "
                           "token ids, which only the ids operand of embedding, embedding_bwd, "
                           "cross_entropy and cross_entropy_bwd reads");
}

TEST(PlanVerifier, DtypesAndBoundariesFollowTheSummaries) {
  RankPlan plan = stageZeroPlan();
  plan.chunks[0].tensors["ln1"].dtype = DType::BF16;
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].tensors[\"ln1\"].dtype\": bf16 is none "
                           "of the model, fp32 and gradient dtypes: expected fp32");
  plan = stageZeroPlan();
  plan.chunks[0].tensors["tokens"].shape = {1, 7};
  EXPECT_EQ(verdict(plan), "rank plan: field \"chunks[0].tensors[\"tokens\"].shape\": [1, 7] is "
                           "not [micro_batch, seq / cp] = [1, 8] of the model and parallel summaries");
  plan = stageZeroPlan();
  plan.params[0].dtype = DType::BF16;
  EXPECT_EQ(verdict(plan), "rank plan: field \"params[0].dtype\": bf16 is not the model dtype, "
                           "fp32");
  plan = stageZeroPlan();
  plan.params[1].shape = {int64_t(1) << 30, int64_t(1) << 30};
  EXPECT_EQ(verdict(plan), "rank plan: field \"params[1].shape\": [1073741824, 1073741824] holds "
                           "more than 2^48 elements, the most a tensor may hold");
}

TEST(PlanVerifier, SizesStayWithinTheLimits) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"world"}, limits::MaxWorld + 1),
            "rank plan: field \"world\": 131073 is more than the limit of 131072");
  EXPECT_EQ(set(plan, {"model", "layers"}, limits::MaxBlocks + 1),
            "rank plan: field \"model.layers\": 4097 is more than the limit of 4096");
  plan.schedule.resize(size_t(limits::MaxPlanEntries), plan.schedule.back());
  EXPECT_EQ(verdict(plan), "rank plan: holds 1048596 ops and instructions, more than the limit "
                           "of 1048576 per rank plan");
}

} // namespace
