//===- PlanTestSupport.h - Hand-built rank plans for the plan tests -------===//
//
// Small valid plans built in memory (stage 0 of a tp 2 x pp 2 job, a single rank) and ways to
// change one field of their JSON and read the verdict, shared by PlanTest.cpp and
// PlanVerifierTest.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_TEST_UNIT_PLANTESTSUPPORT_H
#define PARC_TEST_UNIT_PLANTESTSUPPORT_H

#include "parc/Plan/PlanJSON.h"

#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <variant>

namespace parc::plan::testing {

namespace json = llvm::json;

inline TensorType act(std::vector<int64_t> shape, DType dtype = DType::FP32) {
  return TensorType{std::move(shape), dtype};
}

inline Op op(OpKind kind, std::vector<std::string> in, std::vector<std::string> out,
      std::map<std::string, AttrValue> attrs = {}) {
  return Op{kind, std::move(in), std::move(out), std::move(attrs)};
}

inline ParamShard param(std::string name, std::vector<int64_t> shape, std::vector<Slice> slice,
                 ShardKind kind, Init init) {
  ParamShard p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.slice = std::move(slice);
  p.dtype = DType::FP32;
  p.kind = kind;
  p.init = init;
  return p;
}

inline const Init normal{InitKind::Normal, 0.02}, ones{InitKind::Ones, 0}, zeros{InitKind::Zeros, 0};

inline void setJob(RankPlan &plan, int64_t tp, int64_t pp) {
  plan.model =
      ModelSummary{"toy",     DType::FP32,       256, 256, 8, 16, 4, 4, 4, 64, 2, Norm::LayerNorm,
                   MLP::GELU, Position::Learned, true};
  plan.cluster = ClusterSummary{"box", 1, tp * pp};
  plan.parallel.tp = tp;
  plan.parallel.pp = pp;
  plan.parallel.dp = 1;
  plan.parallel.microBatch = 1;
  plan.parallel.microbatches = 2;
  plan.parallel.globalBatch = 2;
  plan.train.lr = 1e-3;
  plan.world = tp * pp;
  plan.planId = "0123456789abcdef";
}

/// Rank 0 of tp = 2, pp = 2, dp = 1 (order tp-dp-pp): stage 0 with the vocab-parallel
/// embedding, a learned position embedding and the attention half of block 0, under 1F1B
/// with two microbatches.
inline RankPlan stageZeroPlan() {
  RankPlan plan;
  setJob(plan, 2, 2);
  plan.groups = Groups{{0, 1}, {0, 2}, {0}, {0, 1, 2, 3}, {0, 2}, {0}, {0}, {0}, {0}};
  plan.params = {
      param("embedding.word.weight", {256, 16}, {{0, 128}, {0, 16}}, ShardKind::Vocab, normal),
      param("embedding.position.weight", {8, 16}, {{0, 8}, {0, 16}}, ShardKind::Replicated, normal),
      param("block.0.ln1.weight", {16}, {{0, 16}}, ShardKind::Replicated, ones),
      param("block.0.ln1.bias", {16}, {{0, 16}}, ShardKind::Replicated, zeros),
      param("block.0.attn.qkv.weight", {48, 16}, {{0, 24}, {0, 16}}, ShardKind::Column, normal),
      param("block.0.attn.proj.weight", {16, 16}, {{0, 16}, {0, 8}}, ShardKind::Row, normal),
  };
  Chunk c;
  c.firstBlock = c.lastBlock = 0;
  c.hasEmbedding = true;
  c.output = "x1";
  for (const char *name :
       {"emb.partial", "emb", "x0", "ln1", "proj.partial", "proj", "x1", "x1.grad", "x0.grad.res",
        "proj.grad", "ln1.grad.partial", "ln1.grad", "x0.grad.ln", "x0.grad", "emb.grad"})
    c.tensors[name] = act({8, 1, 16});
  for (const char *name : {"q", "k", "v", "ctx", "q.grad", "k.grad", "v.grad", "ctx.grad"})
    c.tensors[name] = act({8, 1, 8});
  c.tensors["qkv"] = c.tensors["qkv.grad"] = act({8, 1, 24});
  c.tensors["lse"] = act({1, 2, 8});
  c.tensors["tokens"] = act({1, 8}, DType::Int64);
  std::string qkv = "block.0.attn.qkv.weight", proj = "block.0.attn.proj.weight";
  std::map<std::string, AttrValue> tpGroup{{"group", std::string("tp")}},
      transB{{"trans_a", false}, {"trans_b", true}}, eps{{"eps", 1e-5}},
      heads{{"causal", true}, {"flash", true}, {"heads", int64_t(2)}, {"kv_heads", int64_t(2)}},
      dim2{{"dim", int64_t(2)}};
  c.forward = {
      op(OpKind::Embedding, {"tokens", "embedding.word.weight"}, {"emb.partial"},
         {{"vocab_offset", int64_t(0)}}),
      op(OpKind::AllReduce, {"emb.partial"}, {"emb"}, tpGroup),
      op(OpKind::PositionEmbedding, {"emb", "embedding.position.weight"}, {"x0"},
         {{"offset", int64_t(0)}}),
      op(OpKind::LayerNorm, {"x0", "block.0.ln1.weight", "block.0.ln1.bias"}, {"ln1"}, eps),
      op(OpKind::MatMul, {"ln1", qkv}, {"qkv"}, transB),
      op(OpKind::Split, {"qkv"}, {"q", "k", "v"}, dim2),
      op(OpKind::Attention, {"q", "k", "v"}, {"ctx", "lse"}, heads),
      op(OpKind::MatMul, {"ctx", proj}, {"proj.partial"}, transB),
      op(OpKind::AllReduce, {"proj.partial"}, {"proj"}, tpGroup),
      op(OpKind::ResidualAdd, {"x0", "proj"}, {"x1"}),
  };
  c.backward = {
      op(OpKind::ResidualAddBwd, {"x1.grad"}, {"x0.grad.res", "proj.grad"}),
      op(OpKind::MatMulBwd, {"ctx", proj, "proj.grad"}, {"ctx.grad", gradName(proj)}, transB),
      op(OpKind::AttentionBwd, {"q", "k", "v", "ctx", "lse", "ctx.grad"},
         {"q.grad", "k.grad", "v.grad"}, heads),
      op(OpKind::SplitBwd, {"q.grad", "k.grad", "v.grad"}, {"qkv.grad"}, dim2),
      op(OpKind::MatMulBwd, {"ln1", qkv, "qkv.grad"}, {"ln1.grad.partial", gradName(qkv)}, transB),
      op(OpKind::AllReduce, {"ln1.grad.partial"}, {"ln1.grad"}, tpGroup),
      op(OpKind::LayerNormBwd, {"x0", "block.0.ln1.weight", "ln1.grad"},
         {"x0.grad.ln", "block.0.ln1.weight.grad", "block.0.ln1.bias.grad"}, eps),
      op(OpKind::ResidualAdd, {"x0.grad.res", "x0.grad.ln"}, {"x0.grad"}),
      op(OpKind::PositionEmbeddingBwd, {"x0.grad"}, {"emb.grad", "embedding.position.weight.grad"},
         {{"offset", int64_t(0)}}),
      op(OpKind::EmbeddingBwd, {"tokens", "emb.grad"}, {"embedding.word.weight.grad"},
         {{"vocab_offset", int64_t(0)}}),
  };
  plan.chunks = {c};
  std::vector<std::string> all;
  for (const ParamShard &p : plan.params)
    all.push_back(p.name);
  plan.schedule = {
      Instr::loadBatch(0),
      Instr::compute(InstrKind::Forward, 0, 0),
      Instr::transfer(InstrKind::SendAct, 2, 0, 0),
      Instr::loadBatch(1),
      Instr::compute(InstrKind::Forward, 0, 1),
      Instr::transfer(InstrKind::SendAct, 2, 0, 1),
      Instr::transfer(InstrKind::RecvGrad, 2, 0, 0),
      Instr::compute(InstrKind::Backward, 0, 0),
      Instr::transfer(InstrKind::RecvGrad, 2, 0, 1),
      Instr::compute(InstrKind::Backward, 0, 1),
      Instr::gradCollective(InstrKind::AllReduceGrads, Group::Embedding, false,
                            {"embedding.word.weight"}),
      Instr::gradCollective(InstrKind::AllReduceGrads, Group::DP, true, all),
      Instr::optimizerStep({Group::Model}),
  };
  return plan;
}

/// The whole toy model on one rank: embedding, final norm and tied head in one chunk, with
/// ZeRO-1's reduce-scatter and all-gather over a dp group of one.
inline RankPlan singleRankPlan() {
  RankPlan plan;
  setJob(plan, 1, 1);
  plan.model.layers = 1;
  plan.parallel.zero = 1;
  plan.groups = Groups{{0}, {0}, {0}, {0}, {}, {0}, {0}, {0}, {0}};
  plan.params = {
      param("embedding.word.weight", {256, 16}, {{0, 256}, {0, 16}}, ShardKind::Vocab, normal),
      param("final_norm.weight", {16}, {{0, 16}}, ShardKind::Replicated, ones),
      param("final_norm.bias", {16}, {{0, 16}}, ShardKind::Replicated, zeros),
  };
  Chunk c;
  c.firstBlock = c.lastBlock = 0;
  c.hasEmbedding = c.hasHead = true;
  c.tensors = {{"tokens", act({1, 8}, DType::Int64)},
               {"labels", act({1, 8}, DType::Int64)},
               {"loss", act({})},
               {"loss.grad", act({})},
               {"x", act({8, 1, 16})},
               {"h", act({8, 1, 16})},
               {"logits", act({8, 1, 256})},
               {"logits.grad", act({8, 1, 256})},
               {"h.grad", act({8, 1, 16})},
               {"x.grad", act({8, 1, 16})}};
  std::string w = "embedding.word.weight";
  std::map<std::string, AttrValue> loss{
      {"group", std::string("tp")}, {"vocab", int64_t(256)}, {"vocab_offset", int64_t(0)}};
  c.forward = {
      op(OpKind::Embedding, {"tokens", w}, {"x"}, {{"vocab_offset", int64_t(0)}}),
      op(OpKind::LayerNorm, {"x", "final_norm.weight", "final_norm.bias"}, {"h"}, {{"eps", 1e-5}}),
      op(OpKind::MatMul, {"h", w}, {"logits"}, {{"trans_a", false}, {"trans_b", true}}),
      op(OpKind::CrossEntropy, {"logits", "labels"}, {"loss"}, loss),
  };
  c.backward = {
      op(OpKind::CrossEntropyBwd, {"logits", "labels", "loss.grad"}, {"logits.grad"}, loss),
      op(OpKind::MatMulBwd, {"h", w, "logits.grad"}, {"h.grad", gradName(w)},
         {{"trans_a", false}, {"trans_b", true}}),
      op(OpKind::LayerNormBwd, {"x", "final_norm.weight", "h.grad"},
         {"x.grad", "final_norm.weight.grad", "final_norm.bias.grad"}, {{"eps", 1e-5}}),
      op(OpKind::EmbeddingBwd, {"tokens", "x.grad"}, {gradName(w)}, {{"vocab_offset", int64_t(0)}}),
  };
  plan.chunks = {c};
  std::vector<std::string> all{w, "final_norm.weight", "final_norm.bias"};
  plan.schedule = {Instr::loadBatch(0),
                   Instr::compute(InstrKind::Forward, 0, 0),
                   Instr::compute(InstrKind::Backward, 0, 0),
                   Instr::loadBatch(1),
                   Instr::compute(InstrKind::Forward, 0, 1),
                   Instr::compute(InstrKind::Backward, 0, 1),
                   Instr::gradCollective(InstrKind::ReduceScatterGrads, Group::DP, true, all),
                   Instr::optimizerStep({Group::Model, Group::DP}),
                   Instr::allGatherParams(Group::DP, all)};
  return plan;
}

inline Manifest manifestFor(const RankPlan &plan) {
  Manifest m;
  m.world = plan.world;
  m.model = plan.model;
  m.cluster = plan.cluster;
  m.parallel = plan.parallel;
  m.train = plan.train;
  m.ranks = {RankEntry{0, 0, 0, Coords{}, rankFileName(0)}};
  m.planId = computeJobPlanId(m);
  return m;
}

inline std::string text(const json::Value &value) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << value;
  return os.str();
}

/// The node at a path of keys and indices ("coords", "tp" or "schedule", "1", "op").
inline json::Value *at(json::Value &root, std::vector<std::string> path) {
  json::Value *node = &root;
  for (const std::string &step : path) {
    if (json::Object *object = node->getAsObject())
      node = object->get(step);
    else
      node = &(*node->getAsArray())[std::stoul(step)];
    if (!node)
      return nullptr;
  }
  return node;
}

/// The reader's message after `mutate` changed a valid plan, or "accepted".
inline std::string rejection(const RankPlan &plan, const std::function<void(json::Value &)> &mutate) {
  json::Value value = toJSON(plan);
  mutate(value);
  llvm::Expected<RankPlan> result = rankPlanFromJSON(value);
  if (result)
    return "accepted";
  return llvm::toString(result.takeError());
}

inline std::string set(const RankPlan &plan, std::vector<std::string> path, json::Value replacement) {
  return rejection(plan, [&](json::Value &root) { *at(root, path) = std::move(replacement); });
}

inline std::string erase(const RankPlan &plan, std::vector<std::string> path) {
  std::string key = path.back();
  path.pop_back();
  return rejection(plan, [&](json::Value &root) { at(root, path)->getAsObject()->erase(key); });
}

} // namespace parc::plan::testing

#endif
