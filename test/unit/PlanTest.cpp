#include "parc/Plan/PlanJSON.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <gtest/gtest.h>

#include <functional>
#include <variant>

using namespace parc::plan;
namespace json = llvm::json;

namespace {

TensorType act(std::vector<int64_t> shape, DType dtype = DType::FP32) {
  return TensorType{std::move(shape), dtype};
}

Op op(OpKind kind, std::vector<std::string> in, std::vector<std::string> out,
      std::map<std::string, AttrValue> attrs = {}) {
  return Op{kind, std::move(in), std::move(out), std::move(attrs)};
}

ParamShard param(std::string name, std::vector<int64_t> shape, std::vector<Slice> slice,
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

const Init normal{InitKind::Normal, 0.02}, ones{InitKind::Ones, 0}, zeros{InitKind::Zeros, 0};

void setJob(RankPlan &plan, int64_t tp, int64_t pp) {
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
RankPlan stageZeroPlan() {
  RankPlan plan;
  setJob(plan, 2, 2);
  plan.groups = Groups{{0, 1}, {0, 2}, {0}, {0, 1, 2, 3}, {0, 2}};
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
      op(OpKind::PositionEmbedding, {"emb", "embedding.position.weight"}, {"x0"}),
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
      op(OpKind::PositionEmbeddingBwd, {"x0.grad"}, {"emb.grad", "embedding.position.weight.grad"}),
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
RankPlan singleRankPlan() {
  RankPlan plan;
  setJob(plan, 1, 1);
  plan.model.layers = 1;
  plan.parallel.zero = 1;
  plan.groups = Groups{{0}, {0}, {0}, {0}, {}};
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

Manifest manifestFor(const RankPlan &plan) {
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

std::string text(const json::Value &value) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << value;
  return os.str();
}

/// The node at a path of keys and indices ("coords", "tp" or "schedule", "1", "op").
json::Value *at(json::Value &root, std::vector<std::string> path) {
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
std::string rejection(const RankPlan &plan, const std::function<void(json::Value &)> &mutate) {
  json::Value value = toJSON(plan);
  mutate(value);
  llvm::Expected<RankPlan> result = rankPlanFromJSON(value);
  if (result)
    return "accepted";
  return llvm::toString(result.takeError());
}

std::string set(const RankPlan &plan, std::vector<std::string> path, json::Value replacement) {
  return rejection(plan, [&](json::Value &root) { *at(root, path) = std::move(replacement); });
}

std::string erase(const RankPlan &plan, std::vector<std::string> path) {
  std::string key = path.back();
  path.pop_back();
  return rejection(plan, [&](json::Value &root) { at(root, path)->getAsObject()->erase(key); });
}

TEST(Plan, HandBuiltPlansAreValid) {
  EXPECT_FALSE(static_cast<bool>(verifyRankPlan(stageZeroPlan())));
  EXPECT_FALSE(static_cast<bool>(verifyRankPlan(singleRankPlan())));
}

TEST(Plan, RankPlanRoundTripsThroughText) {
  for (const RankPlan &plan : {stageZeroPlan(), singleRankPlan()}) {
    std::string written = text(toJSON(plan));
    llvm::Expected<RankPlan> read = parseRankPlan(written);
    ASSERT_TRUE(static_cast<bool>(read)) << llvm::toString(read.takeError());
    EXPECT_EQ(text(toJSON(*read)), written);
    EXPECT_EQ(canonicalText(*read), canonicalText(plan));
  }
  llvm::Expected<RankPlan> read = parseRankPlan(text(toJSON(stageZeroPlan())));
  ASSERT_TRUE(static_cast<bool>(read));
  const Op &split = read->chunks[0].forward[5];
  EXPECT_EQ(split.kind, OpKind::Split);
  EXPECT_EQ(split.outputs, (std::vector<std::string>{"q", "k", "v"}));
  EXPECT_EQ(split.intAttr("dim"), 2);
  EXPECT_EQ(read->chunks[0].forward[3].numberAttr("eps"), 1e-5);
  EXPECT_TRUE(read->chunks[0].forward[4].boolAttr("trans_b"));
  EXPECT_EQ(read->chunks[0].forward[1].groupAttr("group"), Group::TP);
  EXPECT_EQ(read->params[4].localShape(), (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(read->schedule[2].peer, 2);
  EXPECT_EQ(read->schedule[10].group, Group::Embedding);
  EXPECT_TRUE(read->schedule[11].average);
  EXPECT_EQ(read->train.lr, 1e-3);
  EXPECT_EQ(read->groups.embedding, (std::vector<int64_t>{0, 2}));
}

TEST(Plan, FilesRoundTripAndErrorsNameThePath) {
  llvm::SmallString<128> dir;
  ASSERT_FALSE(llvm::sys::fs::createUniqueDirectory("parc-plan-test", dir));
  RankPlan plan = singleRankPlan();
  Manifest manifest = manifestFor(plan);
  plan.planId = manifest.planId;
  std::string rankPath = (dir + "/" + rankFileName(0)).str();
  std::string manifestPath = (dir + "/" + ManifestFileName).str();
  ASSERT_FALSE(static_cast<bool>(writeRankPlan(rankPath, plan)));
  ASSERT_FALSE(static_cast<bool>(writeManifest(manifestPath, manifest)));
  llvm::Expected<RankPlan> readPlan = readRankPlan(rankPath);
  ASSERT_TRUE(static_cast<bool>(readPlan)) << llvm::toString(readPlan.takeError());
  llvm::Expected<Manifest> readBack = readManifest(manifestPath);
  ASSERT_TRUE(static_cast<bool>(readBack)) << llvm::toString(readBack.takeError());
  EXPECT_EQ(text(toJSON(*readBack)), text(toJSON(manifest)));
  EXPECT_EQ(canonicalText(*readPlan), canonicalText(plan));
  EXPECT_FALSE(static_cast<bool>(verifyPlanSet(*readBack, {*readPlan})));

  std::string missing = (dir + "/rank-00001.json").str();
  llvm::Expected<RankPlan> absent = readRankPlan(missing);
  ASSERT_FALSE(static_cast<bool>(absent));
  EXPECT_EQ(llvm::toString(absent.takeError()).rfind(missing + ": cannot read: ", 0), 0u);
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(rankPath, ec);
    os << "{\"format\": \"parc-plan/1\", \"plan_id\": 7}";
  }
  llvm::Expected<RankPlan> bad = readRankPlan(rankPath);
  ASSERT_FALSE(static_cast<bool>(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            rankPath + ": rank plan: field \"plan_id\": expected a string, got an integer");
  llvm::sys::fs::remove_directories(dir);
}

TEST(Plan, CanonicalTextAndPlanId) {
  RankPlan a = stageZeroPlan(), b = stageZeroPlan();
  b.planId = "ffff";
  EXPECT_EQ(canonicalText(a), canonicalText(b));
  EXPECT_EQ(canonicalText(a).find("plan_id"), std::string::npos);
  EXPECT_EQ(canonicalText(a).rfind("{\"chunks\":[", 0), 0u) << "keys are sorted";
  std::string id = computePlanId({canonicalText(a)});
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(id, computePlanId({canonicalText(b)}));
  b.chunks[0].forward[3].attrs["eps"] = 1e-6;
  EXPECT_NE(id, computePlanId({canonicalText(b)}));
  EXPECT_NE(computePlanId({"ab", "c"}), computePlanId({"a", "bc"}));
  // xxHash64 of "1:a\n": pinned so that plan ids stay comparable across parc builds.
  EXPECT_EQ(computePlanId({"a"}), "0f3409a118ecf564");
}

TEST(Plan, RejectsOtherFormatVersion) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"format"}, "parc-plan/2"),
            "rank plan: field \"format\": expected \"parc-plan/1\", got \"parc-plan/2\"; this "
            "reader understands only that version: regenerate the plan with the parc that "
            "matches this runtime");
  EXPECT_EQ(erase(plan, {"format"}), "rank plan: field \"format\": missing required field");
  Manifest manifest = manifestFor(singleRankPlan());
  json::Value value = toJSON(manifest);
  (*value.getAsObject())["format"] = "parc-plan/0";
  llvm::Expected<Manifest> read = manifestFromJSON(value);
  ASSERT_FALSE(static_cast<bool>(read));
  EXPECT_EQ(llvm::toString(read.takeError())
                .rfind("plan manifest: field \"format\": expected "
                       "\"parc-plan/1\", got \"parc-plan/0\"",
                       0),
            0u);
}

TEST(Plan, RejectsMissingWrongTypedAndUnknownFields) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(erase(plan, {"coords", "tp"}),
            "rank plan: field \"coords.tp\": missing required field");
  EXPECT_EQ(erase(plan, {"chunks", "0", "forward", "3", "attrs", "eps"}),
            "rank plan: field \"chunks[0].forward[3].attrs.eps\": missing required field");
  EXPECT_EQ(set(plan, {"coords", "tp"}, "0"),
            "rank plan: field \"coords.tp\": expected an integer, got a string");
  EXPECT_EQ(set(plan, {"coords", "tp"}, 0.5),
            "rank plan: field \"coords.tp\": expected an integer, got a fractional number");
  EXPECT_EQ(set(plan, {"coords", "tp"}, 1e300), "rank plan: field \"coords.tp\": integer out "
                                                "of range");
  EXPECT_EQ(set(plan, {"params", "2", "shape"}, json::Object{}),
            "rank plan: field \"params[2].shape\": expected an array, got an object");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "attrs", "trans_b"}, 1),
            "rank plan: field \"chunks[0].forward[4].attrs.trans_b\": expected a boolean, got "
            "an integer");
  EXPECT_EQ(set(plan, {"model", "dtype"}, "bf61"),
            "rank plan: field \"model.dtype\": unknown dtype 'bf61'; did you mean 'bf16'?");
  EXPECT_EQ(set(plan, {"model", "dtype"}, "complex64"),
            "rank plan: field \"model.dtype\": unknown dtype 'complex64'; expected one of "
            "fp32, bf16, fp16, int64");
  EXPECT_EQ(
      rejection(plan, [](json::Value &root) { (*at(root, {"coords"})->getAsObject())["tq"] = 0; }),
      "rank plan: field \"coords.tq\": unknown field; did you mean 'tp'?");
  EXPECT_EQ(set(plan, {}, json::Array{}), "rank plan: expected an object, got an array");
}

TEST(Plan, RejectsUnknownOps) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"schedule", "1", "op"}, "fwdd"),
            "rank plan: field \"schedule[1].op\": unknown op 'fwdd'; did you mean 'fwd'?");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "op"}, "matmull"),
            "rank plan: field \"chunks[0].forward[4].op\": unknown op 'matmull'; did you mean "
            "'matmul'?");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "inputs"}, json::Array{"ln1"}),
            "rank plan: field \"chunks[0].forward[4].inputs\": 'matmul' takes 2 inputs, got 1");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "op"}, "matmul_bwd"),
            "rank plan: field \"chunks[0].forward[4].inputs\": 'matmul_bwd' takes 3 inputs, "
            "got 2");
}

TEST(Plan, VerifierChecksPlansBuiltInMemory) {
  RankPlan plan = stageZeroPlan();
  plan.chunks[0].forward[3].attrs.erase("eps");
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"chunks[0].forward[3].attrs.eps\": missing required field");
  plan = stageZeroPlan();
  plan.chunks[0].forward[1].attrs["group"] = std::string("everyone");
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"chunks[0].forward[1].attrs.group\": expected a group name");
  plan = stageZeroPlan();
  plan.chunks[0].backward[3].inputs.resize(1);
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"chunks[0].backward[3].inputs\": 'split_bwd' takes at least 2 "
            "inputs, got 1");
  plan = stageZeroPlan();
  plan.chunks[0].forward[0].attrs["eps"] = 1e-5;
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"chunks[0].forward[0].attrs.eps\": 'embedding' has no attribute "
            "'eps'");
  plan = stageZeroPlan();
  plan.planId.clear();
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"plan_id\": expected the hexadecimal plan hash, got \"\"");
}

TEST(Plan, RejectsTruncatedText) {
  std::string full = text(toJSON(stageZeroPlan()));
  ASSERT_TRUE(static_cast<bool>(parseRankPlan(full)));
  for (size_t length = 0; length < full.size(); length += 1 + length / 64) {
    llvm::Expected<RankPlan> read = parseRankPlan(llvm::StringRef(full).take_front(length));
    ASSERT_FALSE(static_cast<bool>(read)) << length;
    EXPECT_EQ(llvm::toString(read.takeError()).rfind("rank plan: malformed JSON: ", 0), 0u);
  }
  llvm::Expected<RankPlan> deep = parseRankPlan(std::string(100000, '['));
  ASSERT_FALSE(static_cast<bool>(deep));
  EXPECT_EQ(llvm::toString(deep.takeError()),
            "rank plan: malformed JSON: nested deeper than 64 levels");
}

TEST(Plan, RejectsRanksOutsideTheWorld) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"rank"}, -1),
            "rank plan: field \"rank\": -1 is outside the 4 ranks of the world (0 to 3)");
  EXPECT_EQ(set(plan, {"rank"}, 4),
            "rank plan: field \"rank\": 4 is outside the 4 ranks of the world (0 to 3)");
  EXPECT_EQ(set(plan, {"groups", "pp", "1"}, 9),
            "rank plan: field \"groups.pp[1]\": 9 is outside the 4 ranks of the world (0 to 3)");
  EXPECT_EQ(set(plan, {"schedule", "2", "peer"}, 3),
            "rank plan: field \"schedule[2].peer\": the next virtual stage of chunk 0 is on "
            "rank 2, not 3");
  EXPECT_EQ(set(plan, {"coords", "dp"}, 1),
            "rank plan: field \"coords.dp\": 1 is outside the 1 dp ranks (0 to 0)");
  EXPECT_EQ(set(plan, {"coords", "tp"}, 1),
            "rank plan: field \"coords\": (tp 1, pp 0, dp 0) do not match rank 0, which the "
            "parallel.order layout puts at (tp 0, pp 0, dp 0)");
}

TEST(Plan, RejectsHugeCountsWithoutAllocatingThem) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(rejection(plan,
                      [](json::Value &root) {
                        *at(root, {"parallel", "microbatches"}) = int64_t(1) << 50;
                        *at(root, {"parallel", "global_batch"}) = int64_t(1) << 50;
                      }),
            "rank plan: field \"schedule\": has 13 instructions, fewer than the chunks x "
            "microbatches = 1 x 1125899906842624 forward passes it must run");
  EXPECT_EQ(set(plan, {"groups", "dp"}, json::Array{0, 1, 2}),
            "rank plan: field \"groups.dp\": has 3 ranks but the layout gives 1");
}

TEST(Plan, RejectsSummaryValuesOutOfRange) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"model", "heads"}, 0),
            "rank plan: field \"model.heads\": must be at least 1, got 0");
  EXPECT_EQ(set(plan, {"train", "betas", "1"}, 1.5),
            "rank plan: field \"train.betas[1]\": must be in [0, 1), got 1.5");
  EXPECT_EQ(set(plan, {"parallel", "order"}, json::Array{"tp", "pp", "tp"}),
            "rank plan: field \"parallel.order\": must list each of tp, dp and pp exactly once");
}

TEST(Plan, RejectsGroupsWithoutTheRank) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"groups", "tp"}, json::Array{1, 3}),
            "rank plan: field \"groups.tp\": [1, 3] does not contain this rank (0); a rank's "
            "group lists must include the rank itself");
  EXPECT_EQ(set(plan, {"groups", "model"}, json::Array{0, 1, 1, 3}),
            "rank plan: field \"groups.model[2]\": rank 1 is listed twice");
  EXPECT_EQ(set(plan, {"groups", "tp"}, json::Array{0, 2}),
            "rank plan: field \"groups.tp\": expected [0, 1] from the rank layout, got [0, 2]");
  EXPECT_EQ(set(plan, {"groups", "embedding"}, json::Array{}),
            "rank plan: field \"groups.embedding\": expected [0, 2] from the rank layout, got "
            "[]");
}

TEST(Plan, RejectsSlicesOutsideTheShape) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"params", "0", "slice", "0", "offset"}, 200),
            "rank plan: field \"params[0].slice[0]\": slice [200, 200 + 128) lies outside "
            "dimension 0 of size 256");
  EXPECT_EQ(set(plan, {"params", "4", "slice", "0", "size"}, 0),
            "rank plan: field \"params[4].slice[0]\": slice [0, 0 + 0) lies outside dimension "
            "0 of size 48");
  EXPECT_EQ(
      set(plan, {"params", "5", "slice"}, json::Array{json::Object{{"offset", 0}, {"size", 16}}}),
      "rank plan: field \"params[5].slice\": has 1 entries but the shape has 2 "
      "dimensions");
  EXPECT_EQ(set(plan, {"params", "4", "kind"}, "row"),
            "rank plan: field \"params[4].slice[0]\": a row parameter is not split along "
            "dimension 0; column and vocab split dim 0, row the last, replicated none");
}

TEST(Plan, RejectsBrokenDataFlow) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "3", "inputs", "0"}, "x1"),
            "rank plan: field \"chunks[0].forward[3].inputs[0]\": 'x1' is read before any op "
            "writes it");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "outputs", "0"}, "x0"),
            "rank plan: field \"chunks[0].forward[4].outputs[0]\": 'x0' is written twice; only "
            "parameter gradients accumulate");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "inputs", "0"}, "nowhere"),
            "rank plan: field \"chunks[0].forward[4].inputs[0]\": 'nowhere' is neither a "
            "parameter nor in the chunk's tensors");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "1", "attrs", "group"}, "embeding"),
            "rank plan: field \"chunks[0].forward[1].attrs.group\": unknown group "
            "'embeding'; did you mean 'embedding'?");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "5", "attrs", "dim"}, 3),
            "rank plan: field \"chunks[0].forward[5].attrs.dim\": dimension 3 does not exist "
            "in 'qkv', which has 3");
}

TEST(Plan, RejectsIncompleteSchedules) {
  RankPlan plan = stageZeroPlan();
  auto without = [&](size_t index) {
    return rejection(plan, [&](json::Value &root) {
      json::Array &schedule = *at(root, {"schedule"})->getAsArray();
      json::Array kept;
      for (size_t i = 0; i < schedule.size(); ++i)
        if (i != index)
          kept.push_back(schedule[i]);
      schedule = std::move(kept);
    });
  };
  EXPECT_EQ(without(9), "rank plan: field \"schedule\": has no 'bwd' of chunk 0 for "
                        "microbatch 1; every chunk runs every microbatch forward and backward "
                        "once");
  EXPECT_EQ(without(0), "rank plan: field \"schedule[0]\": 'fwd' of chunk 0 microbatch 0 runs "
                        "before load_batch of its microbatch");
  EXPECT_EQ(without(12), "rank plan: field \"schedule\": has no optimizer_step");
  EXPECT_EQ(set(plan, {"schedule", "4", "op"}, "bwd"),
            "rank plan: field \"schedule[4]\": 'bwd' of chunk 0 microbatch 1 comes before its "
            "'fwd'");
  EXPECT_EQ(set(plan, {"schedule", "7", "mb"}, 1),
            "rank plan: field \"schedule[8]\": 'recv_grad' of chunk 0 microbatch 1 comes "
            "after the 'bwd' that needs it");
  EXPECT_EQ(set(plan, {"schedule", "10", "params", "0"}, "embedding.word.weights"),
            "rank plan: field \"schedule[10].params[0]\": 'embedding.word.weights' is not a "
            "parameter of this rank");
}

TEST(Plan, ManifestChecksItsRankList) {
  Manifest manifest = manifestFor(singleRankPlan());
  auto rejectManifest = [&](const std::function<void(Manifest &)> &mutate) {
    Manifest copy = manifest;
    mutate(copy);
    llvm::Expected<Manifest> read = manifestFromJSON(toJSON(copy));
    return read ? std::string("accepted") : llvm::toString(read.takeError());
  };
  EXPECT_EQ(rejectManifest([](Manifest &) {}), "accepted");
  EXPECT_EQ(rejectManifest([](Manifest &m) { m.ranks[0].file = "../rank-00000.json"; }),
            "plan manifest: field \"ranks[0].file\": \"../rank-00000.json\" is not a path "
            "relative to the manifest's directory and inside it");
  EXPECT_EQ(rejectManifest([](Manifest &m) { m.ranks.clear(); }),
            "plan manifest: field \"ranks\": lists 0 ranks but world = 1");
  EXPECT_EQ(rejectManifest([](Manifest &m) { m.parallel.globalBatch = 3; }),
            "plan manifest: field \"parallel.global_batch\": global_batch = 3 is not "
            "micro_batch x microbatches x dp = 1 x 2 x 1");
}

TEST(Plan, PlanSetMustHashToTheManifestId) {
  RankPlan plan = singleRankPlan();
  Manifest manifest = manifestFor(plan);
  plan.planId = manifest.planId;
  EXPECT_FALSE(static_cast<bool>(verifyPlanSet(manifest, {plan})));
  EXPECT_EQ(manifest.planId, computeJobPlanId(manifest));
  // The rank list follows from the job description and is not hashed.
  Manifest withoutRanks = manifest;
  withoutRanks.ranks.clear();
  EXPECT_EQ(computeJobPlanId(withoutRanks), manifest.planId);
  EXPECT_EQ(canonicalText(manifest).find("plan_id"), std::string::npos);
  Manifest changed = manifest;
  changed.train.lr = 1;
  EXPECT_EQ(llvm::toString(verifyPlanSet(changed, {plan})),
            "plan set: field \"plan_id\": the manifest's job hashes to " +
                computeJobPlanId(changed) + ", not " + manifest.planId +
                "; the manifest was changed after compilation or comes from a release other "
                "than parc 0.1.0");
  RankPlan edited = plan;
  edited.train.lr = 1;
  EXPECT_EQ(llvm::toString(verifyPlanSet(manifest, {edited})),
            "plan set: rank plan rank-00000.json: field \"train.lr\": 1 differs from the "
            "manifest's 0.001; every rank plan carries the manifest's job: regenerate the plan "
            "directory");
  edited = plan;
  edited.coords.dp = 1;
  EXPECT_EQ(llvm::toString(verifyPlanMatchesManifest(manifest, edited)),
            "rank plan: field \"coords.dp\": 1 differs from the manifest's 0; every rank plan "
            "carries the manifest's job: regenerate the plan directory");
  edited = plan;
  edited.planId = "0123";
  EXPECT_EQ(llvm::toString(verifyPlanSet(manifest, {edited})),
            "plan set: rank plan rank-00000.json: field \"plan_id\": \"0123\" differs from the "
            "manifest's \"" +
                manifest.planId + "\"; the files come from different compilations");
  EXPECT_EQ(llvm::toString(verifyPlanSet(manifest, {})),
            "plan set: the manifest describes 1 ranks but 0 rank plans were given");
}

/// Every node replaced by every wrong kind of value, and every key removed: the reader must
/// answer each with an error or a plan, never crash.
TEST(Plan, SurvivesEveryWrongValue) {
  json::Value original = toJSON(stageZeroPlan());
  std::vector<std::vector<std::string>> paths;
  std::function<void(const json::Value &, std::vector<std::string> &)> collect =
      [&](const json::Value &node, std::vector<std::string> &path) {
        paths.push_back(path);
        if (const json::Object *object = node.getAsObject())
          for (const auto &entry : *object) {
            path.push_back(entry.first.str());
            collect(entry.second, path);
            path.pop_back();
          }
        if (const json::Array *array = node.getAsArray())
          for (size_t i = 0; i < array->size(); ++i) {
            path.push_back(std::to_string(i));
            collect((*array)[i], path);
            path.pop_back();
          }
      };
  std::vector<std::string> root;
  collect(original, root);
  ASSERT_GT(paths.size(), 300u);
  const json::Value wrongValues[] = {
      nullptr, true, -1, 0, 1e30, 0.5, "x", json::Array{}, json::Array{1}, json::Object{}};
  size_t rejected = 0;
  for (const std::vector<std::string> &path : paths) {
    for (const json::Value &wrong : wrongValues) {
      json::Value copy = original;
      *at(copy, path) = wrong;
      llvm::Expected<RankPlan> read = rankPlanFromJSON(copy);
      if (!read) {
        ++rejected;
        EXPECT_EQ(llvm::toString(read.takeError()).rfind("rank plan: ", 0), 0u);
      }
    }
    if (path.empty() || !at(original, {path.begin(), path.end() - 1})->getAsObject())
      continue;
    json::Value copy = original;
    at(copy, {path.begin(), path.end() - 1})->getAsObject()->erase(path.back());
    EXPECT_FALSE(static_cast<bool>(rankPlanFromJSON(copy))) << "every field is required";
  }
  EXPECT_GT(rejected, paths.size() * 8);
}

} // namespace
