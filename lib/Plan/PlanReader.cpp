//===- PlanReader.cpp - JSON to plans, field by field ---------------------===//
//
// This file checks structure only: every field present with its type, no unknown field, every
// enum spelled right, every op with the operand counts and attributes of its kind. Whether the
// values make sense together (ranks in range, slices inside shapes, data flow) is the verifier's
// job (PlanVerifier.cpp), which the readers run on the result.
//
//===----------------------------------------------------------------------===//

#include "parc/Support/FileInput.h"
#include "parc/Support/Limits.h"
#include "parc/Plan/JSONReader.h"
#include "parc/Plan/PlanJSON.h"

#include "llvm/Support/MemoryBuffer.h"

namespace json = llvm::json;
using llvm::Expected;
using llvm::StringRef;

namespace parc::plan {

using namespace detail;

namespace {

/// An ObjectReader for the object under `key` of `parent`; invalid (with the failure
/// recorded) when the key is missing or not an object.
ObjectReader child(ObjectReader &parent, StringRef key) {
  static const json::Value missing = nullptr;
  const json::Value *value = parent.get(key);
  return ObjectReader(parent.context(), value ? *value : missing, parent.pathOf(key));
}

/// Calls `each(element, path)` for the elements of the array under `key`.
template <typename Fn> bool forEachElement(ObjectReader &parent, StringRef key, Fn each) {
  const json::Value *value = parent.get(key);
  const json::Array *array =
      value ? readArray(parent.context(), *value, parent.pathOf(key)) : nullptr;
  if (!array)
    return false;
  for (size_t i = 0; i < array->size(); ++i)
    if (!each((*array)[i], indexPath(parent.pathOf(key), i)))
      return false;
  return true;
}

bool readFormat(ObjectReader &root) {
  std::string format;
  if (!root.read("format", format))
    return false;
  if (format == FormatVersion)
    return true;
  return root.context().fail(
      root.pathOf("format"),
      "expected \"" + FormatVersion + "\", got \"" + format +
          "\"; this reader understands only that version: regenerate the plan with the parc "
          "that matches this runtime");
}

bool readCoords(ObjectReader &parent, StringRef key, Coords &coords) {
  ObjectReader r = child(parent, key);
  r.read("tp", coords.tp);
  r.read("pp", coords.pp);
  r.read("dp", coords.dp);
  r.read("cp", coords.cp);
  return r.finish();
}

bool readPredictedMemory(ObjectReader &parent, PredictedMemory &m) {
  ObjectReader r = child(parent, "predicted_memory");
  r.read("weights", m.weights);
  r.read("grads", m.grads);
  r.read("optimizer", m.optimizer);
  r.read("activations", m.activations);
  r.read("reserve", m.reserve);
  for (auto [key, value] : {std::pair{"weights", m.weights}, {"grads", m.grads},
                            {"optimizer", m.optimizer}, {"activations", m.activations},
                            {"reserve", m.reserve}})
    if (value < 0)
      r.context().fail(r.pathOf(key), "must not be negative");
  return r.finish();
}

bool readGroups(ObjectReader &parent, Groups &groups) {
  ObjectReader r = child(parent, "groups");
  for (Group group : kAllGroups)
    r.read(spelling(group), groups.get(group));
  return r.finish();
}

bool readModel(ObjectReader &parent, ModelSummary &m) {
  ObjectReader r = child(parent, "model");
  r.read("name", m.name);
  r.readEnum("dtype", "dtype", m.dtype);
  r.read("vocab", m.vocab);
  r.read("padded_vocab", m.paddedVocab);
  r.read("seq", m.seq);
  r.read("hidden", m.hidden);
  r.read("heads", m.heads);
  r.read("kv_heads", m.kvHeads);
  r.read("head_dim", m.headDim);
  r.read("ffn", m.ffn);
  r.read("layers", m.layers);
  r.readEnum("norm", "norm", m.norm);
  r.readEnum("mlp", "mlp", m.mlp);
  r.readEnum("position", "position", m.position);
  r.read("tied_embeddings", m.tiedEmbeddings);
  return r.finish();
}

bool readCluster(ObjectReader &parent, ClusterSummary &c) {
  ObjectReader r = child(parent, "cluster");
  r.read("name", c.name);
  r.read("nodes", c.nodes);
  r.read("gpus_per_node", c.gpusPerNode);
  return r.finish();
}

bool readParallel(ObjectReader &parent, ParallelSummary &p) {
  ObjectReader r = child(parent, "parallel");
  r.read("tp", p.tp);
  r.read("pp", p.pp);
  r.read("dp", p.dp);
  r.read("cp", p.cp);
  r.read("ep", p.ep);
  if (r.readEnumList("order", "axis", p.order) && p.order.size() != 4)
    return r.context().fail(r.pathOf("order"), "expected the 4 axes tp, cp, dp and pp, got " +
                                                   llvm::Twine(p.order.size()) + " entries");
  r.read("chunks", p.chunks);
  r.read("micro_batch", p.microBatch);
  r.read("microbatches", p.microbatches);
  r.read("global_batch", p.globalBatch);
  r.readEnum("schedule", "schedule", p.schedule);
  r.read("zero", p.zero);
  r.read("bucket_size", p.bucketSize);
  r.readEnum("recompute", "recompute", p.recompute);
  r.read("sequence_parallel", p.sequenceParallel);
  return r.finish();
}

bool readTrain(ObjectReader &parent, TrainSettings &t) {
  ObjectReader r = child(parent, "train");
  r.readEnum("optimizer", "optimizer", t.optimizer);
  r.read("lr", t.lr);
  size_t betas = 0;
  forEachElement(r, "betas", [&](const json::Value &value, const std::string &path) {
    if (betas == 2)
      return r.context().fail(r.pathOf("betas"), "expected two numbers (beta1, beta2)");
    return readNumber(r.context(), value, path, t.betas[betas++]);
  });
  if (betas != 2)
    r.context().fail(r.pathOf("betas"), "expected two numbers (beta1, beta2)");
  r.read("eps", t.eps);
  r.read("momentum", t.momentum);
  r.read("weight_decay", t.weightDecay);
  r.read("grad_clip", t.gradClip);
  r.read("steps", t.steps);
  r.read("seed", t.seed);
  r.read("warmup_steps", t.warmupSteps);
  r.readEnum("grad_dtype", "dtype", t.gradDtype);
  return r.finish();
}

bool readParam(ReadContext &ctx, const json::Value &value, const std::string &path, ParamShard &p) {
  ObjectReader r(ctx, value, path);
  r.read("name", p.name);
  r.read("shape", p.shape);
  forEachElement(r, "slice", [&](const json::Value &element, const std::string &elementPath) {
    ObjectReader s(ctx, element, elementPath);
    Slice slice;
    s.read("offset", slice.offset);
    s.read("size", slice.size);
    p.slice.push_back(slice);
    return s.finish();
  });
  r.readEnum("dtype", "dtype", p.dtype);
  r.readEnum("kind", "shard kind", p.kind);
  ObjectReader init = child(r, "init");
  if (init.readEnum("kind", "init kind", p.init.kind) && p.init.kind == InitKind::Normal) {
    init.read("std", p.init.std);
    init.read("rows", p.init.rows);
  }
  init.finish();
  r.read("counts_in_grad_norm", p.countsInGradNorm);
  return r.finish();
}

bool readTensorType(ReadContext &ctx, const json::Value &value, const std::string &path,
                    TensorType &type) {
  ObjectReader r(ctx, value, path);
  r.read("shape", type.shape);
  r.readEnum("dtype", "dtype", type.dtype);
  return r.finish();
}

bool readAttr(ReadContext &ctx, const json::Value &value, const std::string &path, AttrType type,
              AttrValue &out) {
  switch (type) {
  case AttrType::Bool: {
    bool b = false;
    out = b;
    return readBool(ctx, value, path, std::get<bool>(out));
  }
  case AttrType::Int:
    out = int64_t(0);
    return readInt(ctx, value, path, std::get<int64_t>(out));
  case AttrType::Number:
    out = 0.0;
    return readNumber(ctx, value, path, std::get<double>(out));
  case AttrType::Group: {
    Group group = Group::TP;
    if (!readEnum(ctx, value, path, "group", group))
      return false;
    out = spelling(group).str();
    return true;
  }
  }
  return false;
}

bool readOp(ReadContext &ctx, const json::Value &value, const std::string &path, Op &op) {
  ObjectReader r(ctx, value, path);
  if (!r.readEnum("op", "op", op.kind))
    return false;
  // Operand counts are the verifier's (checkOpSignature), which also sees plans built in
  // memory; the attributes are read here because their JSON types depend on the op kind.
  r.read("inputs", op.inputs);
  r.read("outputs", op.outputs);
  ObjectReader attrs = child(r, "attrs");
  for (const AttrSpec &spec : opInfo(op.kind).attrs) {
    const json::Value *attr = attrs.get(spec.name);
    if (!attr ||
        !readAttr(ctx, *attr, attrs.pathOf(spec.name), spec.type, op.attrs[spec.name.str()]))
      return false;
  }
  attrs.finish();
  return r.finish();
}

bool readOps(ObjectReader &parent, StringRef key, std::vector<Op> &ops) {
  return forEachElement(parent, key, [&](const json::Value &value, const std::string &path) {
    ops.emplace_back();
    return readOp(parent.context(), value, path, ops.back());
  });
}

bool readChunk(ReadContext &ctx, const json::Value &value, const std::string &path, Chunk &c) {
  ObjectReader r(ctx, value, path);
  r.read("index", c.index);
  r.read("virtual_stage", c.virtualStage);
  r.read("first_block", c.firstBlock);
  r.read("last_block", c.lastBlock);
  r.read("has_embedding", c.hasEmbedding);
  r.read("has_head", c.hasHead);
  r.read("input", c.input);
  r.read("output", c.output);
  ObjectReader tensors = child(r, "tensors");
  if (const json::Object *table =
          value.getAsObject() ? value.getAsObject()->getObject("tensors") : nullptr) {
    // Sorted so that, of several bad entries, the same one is always reported.
    std::vector<std::string> names;
    for (const auto &entry : *table)
      names.push_back(entry.first.str());
    llvm::sort(names);
    for (const std::string &name : names)
      readTensorType(ctx, *table->get(name), entryPath(tensors.path(), name), c.tensors[name]);
  }
  readOps(r, "forward", c.forward);
  readOps(r, "backward", c.backward);
  return r.finish();
}

bool readInstr(ReadContext &ctx, const json::Value &value, const std::string &path, Instr &instr) {
  ObjectReader r(ctx, value, path);
  if (!r.readEnum("op", "op", instr.op))
    return false;
  if (mayRunWithin(instr.op))
    r.read("within", instr.within);
  switch (instr.op) {
  case InstrKind::LoadBatch:
    r.read("mb", instr.microbatch);
    break;
  case InstrKind::SendAct:
  case InstrKind::RecvAct:
  case InstrKind::SendGrad:
  case InstrKind::RecvGrad:
    r.read("peer", instr.peer);
    [[fallthrough]];
  case InstrKind::Forward:
  case InstrKind::Backward:
    r.read("chunk", instr.chunk);
    r.read("mb", instr.microbatch);
    break;
  case InstrKind::AllReduceGrads:
  case InstrKind::ReduceScatterGrads:
    r.read("average", instr.average);
    [[fallthrough]];
  case InstrKind::AllGatherParams:
    r.readEnum("group", "group", instr.group);
    [[fallthrough]];
  case InstrKind::ReleaseParams:
    r.read("params", instr.params);
    break;
  case InstrKind::OptimizerStep:
    r.readEnumList("norm_groups", "group", instr.normGroups);
    break;
  }
  return r.finish();
}

template <typename T, typename ReadFn>
bool readList(ObjectReader &parent, StringRef key, std::vector<T> &out, ReadFn readOne) {
  return forEachElement(parent, key, [&](const json::Value &value, const std::string &path) {
    out.emplace_back();
    return readOne(parent.context(), value, path, out.back());
  });
}

bool readRankEntry(ReadContext &ctx, const json::Value &value, const std::string &path,
                   RankEntry &entry) {
  ObjectReader r(ctx, value, path);
  r.read("rank", entry.rank);
  r.read("node", entry.node);
  r.read("local_rank", entry.localRank);
  readCoords(r, "coords", entry.coords);
  r.read("file", entry.file);
  return r.finish();
}

Expected<json::Value> parseText(StringRef text, StringRef document) {
  if (jsonTooDeepAt(text, unsigned(limits::MaxJSONDepth)) != StringRef::npos)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: malformed JSON: nested deeper than %u levels",
                                   document.str().c_str(), unsigned(limits::MaxJSONDepth));
  Expected<json::Value> value = json::parse(text);
  if (!value)
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s: malformed JSON: %s",
                                   document.str().c_str(),
                                   llvm::toString(value.takeError()).c_str());
  return value;
}

template <typename T>
Expected<T> readFile(StringRef path, llvm::function_ref<Expected<T>(StringRef)> parse) {
  Expected<std::unique_ptr<llvm::MemoryBuffer>> buffer =
      readRegularFile(path, limits::MaxPlanFileBytes);
  if (!buffer)
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s: cannot read: %s",
                                   path.str().c_str(), llvm::toString(buffer.takeError()).c_str());
  Expected<T> result = parse((*buffer)->getBuffer());
  if (!result)
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s: %s", path.str().c_str(),
                                   llvm::toString(result.takeError()).c_str());
  return result;
}

} // namespace

Expected<RankPlan> rankPlanFromJSON(const json::Value &value, const Manifest *manifest) {
  ReadContext ctx("rank plan");
  ObjectReader root(ctx, value, "");
  RankPlan plan;
  if (readFormat(root)) {
    root.read("plan_id", plan.planId);
    root.read("world", plan.world);
    root.read("rank", plan.rank);
    root.read("node", plan.node);
    root.read("local_rank", plan.localRank);
    readCoords(root, "coords", plan.coords);
    readGroups(root, plan.groups);
    readModel(root, plan.model);
    readCluster(root, plan.cluster);
    readParallel(root, plan.parallel);
    readTrain(root, plan.train);
    readList(root, "params", plan.params, readParam);
    readList(root, "chunks", plan.chunks, readChunk);
    readList(root, "schedule", plan.schedule, readInstr);
    readPredictedMemory(root, plan.predictedMemory);
    root.finish();
  }
  if (ctx.failed())
    return ctx.takeError();
  if (manifest)
    if (llvm::Error error = verifyPlanMatchesManifest(*manifest, plan))
      return {std::move(error)};
  if (llvm::Error error = verifyRankPlan(plan))
    return {std::move(error)};
  return plan;
}

Expected<Manifest> manifestFromJSON(const json::Value &value) {
  ReadContext ctx("plan manifest");
  ObjectReader root(ctx, value, "");
  Manifest manifest;
  if (readFormat(root)) {
    root.read("plan_id", manifest.planId);
    root.read("world", manifest.world);
    readModel(root, manifest.model);
    readCluster(root, manifest.cluster);
    readParallel(root, manifest.parallel);
    readTrain(root, manifest.train);
    readList(root, "ranks", manifest.ranks, readRankEntry);
    root.finish();
  }
  if (ctx.failed())
    return ctx.takeError();
  if (llvm::Error error = verifyManifest(manifest))
    return {std::move(error)};
  return manifest;
}

Expected<RankPlan> parseRankPlan(StringRef text, const Manifest *manifest) {
  Expected<json::Value> value = parseText(text, "rank plan");
  if (!value)
    return value.takeError();
  return rankPlanFromJSON(*value, manifest);
}

Expected<Manifest> parseManifest(StringRef text) {
  Expected<json::Value> value = parseText(text, "plan manifest");
  if (!value)
    return value.takeError();
  return manifestFromJSON(*value);
}

Expected<RankPlan> readRankPlan(StringRef path, const Manifest *manifest) {
  return readFile<RankPlan>(path, [&](StringRef text) { return parseRankPlan(text, manifest); });
}

Expected<Manifest> readManifest(StringRef path) {
  return readFile<Manifest>(path, [](StringRef text) { return parseManifest(text); });
}

} // namespace parc::plan
