//===- PlanWriter.cpp - Plans to JSON, canonical text and plan id ---------===//

#include "parc/Plan/PlanJSON.h"
#include "parc/Support/FileOutput.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/xxhash.h"

namespace json = llvm::json;
using llvm::StringRef;

namespace parc::plan {

namespace {

template <typename E> json::Value enumValue(E value) { return spelling(value).str(); }

json::Array intList(const std::vector<int64_t> &values) {
  json::Array array;
  for (int64_t v : values)
    array.push_back(v);
  return array;
}

json::Array stringList(const std::vector<std::string> &values) {
  json::Array array;
  for (const std::string &v : values)
    array.push_back(v);
  return array;
}

json::Array groupList(llvm::ArrayRef<Group> groups) {
  json::Array array;
  for (Group g : groups)
    array.push_back(enumValue(g));
  return array;
}

json::Object predictedMemoryJSON(const PredictedMemory &m) {
  return json::Object{{"weights", m.weights},
                      {"grads", m.grads},
                      {"optimizer", m.optimizer},
                      {"activations", m.activations},
                      {"reserve", m.reserve}};
}

json::Object coordsJSON(const Coords &c) {
  return json::Object{{"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"cp", c.cp}};
}

json::Object groupsJSON(const Groups &g) {
  return json::Object{{"tp", intList(g.tp)},
                      {"pp", intList(g.pp)},
                      {"dp", intList(g.dp)},
                      {"model", intList(g.model)},
                      {"embedding", intList(g.embedding)},
                      {"cp", intList(g.cp)},
                      {"dp_cp", intList(g.dpCp)},
                      {"ep", intList(g.ep)},
                      {"expert_dp", intList(g.expertDp)}};
}

json::Object modelJSON(const ModelSummary &m) {
  return json::Object{{"name", m.name},
                      {"dtype", enumValue(m.dtype)},
                      {"vocab", m.vocab},
                      {"padded_vocab", m.paddedVocab},
                      {"seq", m.seq},
                      {"hidden", m.hidden},
                      {"heads", m.heads},
                      {"kv_heads", m.kvHeads},
                      {"head_dim", m.headDim},
                      {"ffn", m.ffn},
                      {"layers", m.layers},
                      {"norm", enumValue(m.norm)},
                      {"mlp", enumValue(m.mlp)},
                      {"position", enumValue(m.position)},
                      {"tied_embeddings", m.tiedEmbeddings}};
}

json::Object clusterJSON(const ClusterSummary &c) {
  return json::Object{{"name", c.name}, {"nodes", c.nodes}, {"gpus_per_node", c.gpusPerNode}};
}

json::Object parallelJSON(const ParallelSummary &p) {
  return json::Object{{"tp", p.tp},
                      {"bucket_size", p.bucketSize},
                      {"pp", p.pp},
                      {"dp", p.dp},
                      {"cp", p.cp},
                      {"ep", p.ep},
                      {"order", groupList(p.order)},
                      {"chunks", p.chunks},
                      {"micro_batch", p.microBatch},
                      {"microbatches", p.microbatches},
                      {"global_batch", p.globalBatch},
                      {"schedule", enumValue(p.schedule)},
                      {"zero", p.zero},
                      {"recompute", enumValue(p.recompute)},
                      {"sequence_parallel", p.sequenceParallel}};
}

json::Object trainJSON(const TrainSettings &t) {
  return json::Object{{"optimizer", enumValue(t.optimizer)},
                      {"lr", t.lr},
                      {"betas", json::Array{t.betas[0], t.betas[1]}},
                      {"eps", t.eps},
                      {"momentum", t.momentum},
                      {"weight_decay", t.weightDecay},
                      {"grad_clip", t.gradClip},
                      {"steps", t.steps},
                      {"seed", t.seed},
                      {"warmup_steps", t.warmupSteps},
                      {"grad_dtype", enumValue(t.gradDtype)}};
}

json::Object paramJSON(const ParamShard &p) {
  json::Array slice;
  for (const Slice &s : p.slice)
    slice.push_back(json::Object{{"offset", s.offset}, {"size", s.size}});
  json::Object init{{"kind", enumValue(p.init.kind)}};
  if (p.init.kind == InitKind::Normal) {
    init["std"] = p.init.std;
    init["rows"] = p.init.rows;
  }
  return json::Object{{"name", p.name},
                      {"shape", intList(p.shape)},
                      {"slice", std::move(slice)},
                      {"dtype", enumValue(p.dtype)},
                      {"kind", enumValue(p.kind)},
                      {"init", std::move(init)},
                      {"counts_in_grad_norm", p.countsInGradNorm}};
}

json::Value attrJSON(const AttrValue &value) {
  return std::visit([](const auto &v) { return json::Value(v); }, value);
}

json::Object opJSON(const Op &op) {
  json::Object attrs;
  for (const auto &[name, value] : op.attrs)
    attrs[name] = attrJSON(value);
  return json::Object{{"op", enumValue(op.kind)},
                      {"inputs", stringList(op.inputs)},
                      {"outputs", stringList(op.outputs)},
                      {"attrs", std::move(attrs)}};
}

json::Array opsJSON(const std::vector<Op> &ops) {
  json::Array array;
  for (const Op &op : ops)
    array.push_back(opJSON(op));
  return array;
}

json::Object chunkJSON(const Chunk &c) {
  json::Object tensors;
  for (const auto &[name, type] : c.tensors)
    tensors[name] = json::Object{{"shape", intList(type.shape)}, {"dtype", enumValue(type.dtype)}};
  return json::Object{{"index", c.index},
                      {"virtual_stage", c.virtualStage},
                      {"first_block", c.firstBlock},
                      {"last_block", c.lastBlock},
                      {"has_embedding", c.hasEmbedding},
                      {"has_head", c.hasHead},
                      {"input", c.input},
                      {"output", c.output},
                      {"tensors", std::move(tensors)},
                      {"forward", opsJSON(c.forward)},
                      {"backward", opsJSON(c.backward)}};
}

json::Object instrJSON(const Instr &instr) {
  json::Object object{{"op", enumValue(instr.op)}};
  if (mayRunWithin(instr.op))
    object["within"] = instr.within;
  switch (instr.op) {
  case InstrKind::LoadBatch:
    object["mb"] = instr.microbatch;
    break;
  case InstrKind::SendAct:
  case InstrKind::RecvAct:
  case InstrKind::SendGrad:
  case InstrKind::RecvGrad:
    object["peer"] = instr.peer;
    [[fallthrough]];
  case InstrKind::Forward:
  case InstrKind::Backward:
    object["chunk"] = instr.chunk;
    object["mb"] = instr.microbatch;
    break;
  case InstrKind::AllReduceGrads:
  case InstrKind::ReduceScatterGrads:
    object["average"] = instr.average;
    [[fallthrough]];
  case InstrKind::AllGatherParams:
    object["group"] = enumValue(instr.group);
    [[fallthrough]];
  case InstrKind::ReleaseParams:
    object["params"] = stringList(instr.params);
    break;
  case InstrKind::OptimizerStep:
    object["norm_groups"] = groupList(instr.normGroups);
    break;
  }
  return object;
}

json::Object rankPlanObject(const RankPlan &plan) {
  json::Array params, chunks, schedule;
  for (const ParamShard &p : plan.params)
    params.push_back(paramJSON(p));
  for (const Chunk &c : plan.chunks)
    chunks.push_back(chunkJSON(c));
  for (const Instr &i : plan.schedule)
    schedule.push_back(instrJSON(i));
  return json::Object{{"format", FormatVersion},
                      {"plan_id", plan.planId},
                      {"world", plan.world},
                      {"rank", plan.rank},
                      {"node", plan.node},
                      {"local_rank", plan.localRank},
                      {"coords", coordsJSON(plan.coords)},
                      {"groups", groupsJSON(plan.groups)},
                      {"model", modelJSON(plan.model)},
                      {"cluster", clusterJSON(plan.cluster)},
                      {"parallel", parallelJSON(plan.parallel)},
                      {"train", trainJSON(plan.train)},
                      {"params", std::move(params)},
                      {"chunks", std::move(chunks)},
                      {"schedule", std::move(schedule)},
                      {"predicted_memory", predictedMemoryJSON(plan.predictedMemory)}};
}

llvm::Error writeJSONFile(StringRef path, const json::Value &value) {
  return writeFile(
      path, [&](llvm::raw_ostream &os) { os << llvm::formatv("{0:2}", value) << "\n"; },
      llvm::sys::fs::OF_Text);
}

} // namespace

json::Value toJSON(const RankPlan &plan) { return rankPlanObject(plan); }

json::Value toJSON(const Manifest &manifest) {
  json::Array ranks;
  for (const RankEntry &entry : manifest.ranks)
    ranks.push_back(json::Object{{"rank", entry.rank},
                                 {"node", entry.node},
                                 {"local_rank", entry.localRank},
                                 {"coords", coordsJSON(entry.coords)},
                                 {"file", entry.file}});
  return json::Object{{"format", FormatVersion},
                      {"plan_id", manifest.planId},
                      {"world", manifest.world},
                      {"model", modelJSON(manifest.model)},
                      {"cluster", clusterJSON(manifest.cluster)},
                      {"parallel", parallelJSON(manifest.parallel)},
                      {"train", trainJSON(manifest.train)},
                      {"ranks", std::move(ranks)}};
}

llvm::Error writeRankPlan(StringRef path, const RankPlan &plan) {
  return writeJSONFile(path, toJSON(plan));
}

llvm::Error writeManifest(StringRef path, const Manifest &manifest) {
  return writeJSONFile(path, toJSON(manifest));
}

std::string canonicalText(const RankPlan &plan) {
  json::Object object = rankPlanObject(plan);
  object.erase("plan_id");
  // llvm::json prints object keys sorted and doubles with 17 significant digits, so equal
  // plans give equal text on every host.
  std::string text;
  llvm::raw_string_ostream os(text);
  os << json::Value(std::move(object));
  return os.str();
}

std::string computePlanId(llvm::ArrayRef<std::string> canonicalTexts) {
  // Length-prefixing keeps ["ab", "c"] and ["a", "bc"] apart.
  std::string joined;
  for (const std::string &text : canonicalTexts)
    joined += std::to_string(text.size()) + ":" + text + "\n";
  std::string id;
  llvm::raw_string_ostream os(id);
  os << llvm::format_hex_no_prefix(llvm::xxHash64(joined), 16);
  return os.str();
}

} // namespace parc::plan
