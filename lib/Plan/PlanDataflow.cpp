//===- PlanDataflow.cpp - Tensor tables and op lists of the chunks --------===//
//
// A runtime executes a chunk's op list top to bottom without analysing it, so the verifier
// makes sure that doing so is well-defined: every operand is declared (a parameter, its
// gradient or a tensor of the chunk's table), read only after it is written, and written once
// per pass, except parameter gradients, which accumulate over ops and microbatches.
//
//===----------------------------------------------------------------------===//

#include "PlanVerifierInternal.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>

using llvm::StringRef;
using llvm::Twine;

namespace parc::plan::detail {

namespace {

/// The local shape of each parameter shard this rank owns, by name.
using ParamShapes = llvm::StringMap<std::vector<int64_t>>;

class ChunkFlow {
public:
  ChunkFlow(ReadContext &ctx, const RankPlan &plan, const Chunk &chunk, std::string path,
            const ParamShapes &params, llvm::StringSet<> &gradsWritten)
      : ctx(ctx), plan(plan), chunk(chunk), path(std::move(path)), params(params),
        gradsWritten(gradsWritten) {}

  void run();

private:
  bool isParam(StringRef name) const { return params.count(name); }
  bool isParamGrad(StringRef name) const {
    return name.endswith(".grad") && isParam(name.drop_back(5));
  }
  /// The int64 tensors of the table: token ids (tokens and labels) and row counts.
  bool isInt64(StringRef name) const {
    auto it = chunk.tensors.find(name.str());
    return it != chunk.tensors.end() && it->second.dtype == DType::Int64;
  }
  static bool isIdsName(StringRef name) { return name == "tokens" || name == "labels"; }
  bool isIds(StringRef name) const { return isIdsName(name) && isInt64(name); }
  bool isCounts(StringRef name) const { return !isIdsName(name) && isInt64(name); }
  /// A declared operand's shape: a parameter's (or its gradient's) is the shard's.
  OperandShape shapeOf(StringRef name) const;
  /// Number of dimensions of a declared operand.
  size_t rankOf(StringRef name) const { return shapeOf(name).shape.size(); }

  void checkTable();
  void checkEntry(const std::string &name, const TensorType &type);
  void checkBoundaries();
  void requireEntry(StringRef name, StringRef why);
  void requireShape(StringRef name, llvm::ArrayRef<int64_t> shape, StringRef form);
  // Paths are built only for a message: verifying a large plan visits many thousands of ops.
  void checkOp(const Op &op, StringRef list, size_t index, bool backward);
  void checkAttrs(const Op &op, llvm::function_ref<std::string()> opPath);
  void checkInputRoles(const Op &op, llvm::function_ref<std::string()> opPath, bool &gradient);
  void checkOutputRoles(const Op &op, llvm::function_ref<std::string()> opPath, bool gradient);
  void checkShapes(const Op &op, llvm::function_ref<std::string()> opPath);
  void requireWritten(StringRef name, StringRef list, StringRef why);

  ReadContext &ctx;
  const RankPlan &plan;
  const Chunk &chunk;
  std::string path;
  const ParamShapes &params;
  llvm::StringSet<> &gradsWritten;
  llvm::StringSet<> defined;
  /// The defined tensors that hold gradients: the backward's seed and what is computed
  /// from it.
  llvm::StringSet<> gradients;
  // What a recv wrote: a value or a gradient as the peer sent it, which one rank's plan cannot
  // tell (ring attention passes keys and values, then their gradients), so no role rule reads it.
  llvm::StringSet<> received;
};

OperandShape ChunkFlow::shapeOf(StringRef name) const {
  auto param = params.find(isParamGrad(name) ? name.drop_back(5) : name);
  if (param != params.end())
    return {name, param->second};
  return {name, chunk.tensors.at(name.str()).shape};
}

void ChunkFlow::requireEntry(StringRef name, StringRef why) {
  if (!chunk.tensors.count(name.str()))
    ctx.fail(fieldPath(path, "tensors"), "has no entry for '" + name + "', " + why);
}

/// One entry of the tensor table: its name, dims, size and dtype (ids are int64 and named
/// tokens or labels, row counts int64 of any other name; every other tensor is in the model
/// dtype, fp32 or the gradient dtype).
void ChunkFlow::checkEntry(const std::string &name, const TensorType &type) {
  auto entry = [&] { return entryPath(fieldPath(path, "tensors"), name); };
  if (name.empty())
    ctx.fail(entry(), "a tensor needs a name");
  else if (isParam(name) || isParamGrad(name))
    ctx.fail(entry(), "'" + name + "' is a parameter or a parameter gradient, which are " +
                          "declared by \"params\"; rename the tensor");
  for (size_t d = 0; d < type.shape.size(); ++d)
    if (type.shape[d] < 1)
      ctx.fail(indexPath(fieldPath(entry(), "shape"), d),
               "must be at least 1, got " + Twine(type.shape[d]));
  if (!ctx.failed() && !elementCount(type.shape))
    ctx.fail(fieldPath(entry(), "shape"), shapeText(type.shape) + " holds more than 2^48 " +
                                              "elements, the most a tensor may hold");
  bool ids = isIdsName(name);
  // Activations are in the model dtype; logits, the loss and gradient sums may be in fp32 or
  // the gradient dtype (Megatron's fp32 logits and main gradients).
  llvm::SmallVector<StringRef, 3> floats;
  for (DType allowed : {plan.model.dtype, DType::FP32, plan.train.gradDtype})
    if (!llvm::is_contained(floats, spelling(allowed)))
      floats.push_back(spelling(allowed));
  DType dtype = type.dtype;
  if (ids && dtype != DType::Int64)
    ctx.fail(fieldPath(entry(), "dtype"), "token ids are int64");
  else if (dtype != DType::Int64 && !llvm::is_contained(floats, spelling(dtype)))
    ctx.fail(fieldPath(entry(), "dtype"),
             spelling(dtype) + " is none of the model, fp32 and gradient dtypes: expected " +
                 llvm::join(floats, " or "));
}

void ChunkFlow::requireShape(StringRef name, llvm::ArrayRef<int64_t> shape, StringRef form) {
  auto it = chunk.tensors.find(name.str());
  if (!ctx.failed() && it != chunk.tensors.end() && llvm::ArrayRef<int64_t>(it->second.shape) != shape)
    ctx.fail(fieldPath(entryPath(fieldPath(path, "tensors"), name), "shape"),
             shapeText(it->second.shape) + " is not " + form + " = " + shapeText(shape) +
                 " of the model and parallel summaries");
}

/// What crosses the chunk's edges has the shape the summaries give, so that the peers of a
/// transfer and load_batch agree on sizes: ids [micro_batch, seq / cp], activations and their
/// gradients [seq / cp (/ tp with sequence parallelism), micro_batch, hidden].
void ChunkFlow::checkBoundaries() {
  const ParallelSummary &p = plan.parallel;
  if (p.cp < 1 || plan.model.seq % p.cp != 0) {
    ctx.fail("parallel.cp", "context parallelism splits seq = " + Twine(plan.model.seq) +
                                " over cp = " + Twine(p.cp) + ", which does not divide it");
    return;
  }
  int64_t seq = plan.model.seq / p.cp; // this rank's positions
  if (p.sequenceParallel && seq % p.tp != 0) {
    ctx.fail("model.seq", "sequence parallelism splits seq / cp = " + Twine(seq) + " over tp = " +
                              Twine(p.tp) + ", which does not divide it");
    return;
  }
  int64_t rows = p.sequenceParallel ? seq / p.tp : seq;
  std::vector<int64_t> activation = {rows, p.microBatch, plan.model.hidden};
  StringRef form = p.sequenceParallel ? "[seq / cp / tp, micro_batch, hidden]"
                                      : "[seq / cp, micro_batch, hidden]";
  for (const std::string *name : {&chunk.input, &chunk.output})
    if (!name->empty()) {
      requireShape(*name, activation, form);
      requireShape(gradName(*name), activation, form);
    }
  for (StringRef name : {"tokens", "labels"})
    requireShape(name, {p.microBatch, seq}, "[micro_batch, seq / cp]");
}

void ChunkFlow::checkTable() {
  for (const auto &[name, type] : chunk.tensors) {
    checkEntry(name, type);
    if (ctx.failed())
      return;
  }
  if (!chunk.input.empty()) {
    requireEntry(chunk.input, "the activation it receives");
    requireEntry(gradName(chunk.input), "the gradient it sends back");
  }
  if (!chunk.output.empty()) {
    requireEntry(chunk.output, "the activation it sends");
    requireEntry(gradName(chunk.output), "the gradient it receives");
  }
  for (auto [name, needed] : {std::pair{"tokens", chunk.hasEmbedding},
                              {"labels", chunk.hasHead},
                              {"loss", chunk.hasHead},
                              {"loss.grad", chunk.hasHead}}) {
    if (!needed)
      continue;
    requireEntry(name,
                 StringRef(name) == "tokens" ? "which the embedding reads" : "which the head uses");
    auto it = chunk.tensors.find(name);
    if (ctx.failed() || it == chunk.tensors.end())
      return;
    bool batchInput = StringRef(name) == "tokens" || StringRef(name) == "labels";
    if (!batchInput && !it->second.shape.empty())
      ctx.fail(fieldPath(entryPath(fieldPath(path, "tensors"), name), "shape"),
               "the loss is a scalar: its shape is []");
  }
  checkBoundaries();
}

void ChunkFlow::checkAttrs(const Op &op, llvm::function_ref<std::string()> opPath) {
  auto attrsPath = [&] { return fieldPath(opPath(), "attrs"); };
  for (const AttrSpec &spec : opInfo(op.kind).attrs) {
    auto attrPath = [&] { return fieldPath(attrsPath(), spec.name); };
    StringRef name = spec.name;
    if (spec.type == AttrType::Group) {
      Group group = op.groupAttr(name);
      if (plan.groups.get(group).empty())
        ctx.fail(attrPath(), "this rank is in no '" + spelling(group) + "' group");
    } else if (name == "vocab") {
      int64_t vocab = op.intAttr(name);
      if (vocab < 1 || vocab > plan.model.paddedVocab)
        ctx.fail(attrPath(), Twine(vocab) + " is not a vocabulary size within the padded " +
                                 "vocabulary of " + Twine(plan.model.paddedVocab));
    } else if (name == "vocab_offset") {
      int64_t offset = op.intAttr(name);
      if (offset < 0 || offset >= plan.model.paddedVocab)
        ctx.fail(attrPath(), Twine(offset) + " is outside the padded vocabulary of " +
                                 Twine(plan.model.paddedVocab));
    } else if (name == "heads" || name == "kv_heads") {
      if (op.intAttr(name) < 1)
        ctx.fail(attrPath(), "must be at least 1, got " + Twine(op.intAttr(name)));
    } else if (name == "top_k") {
      if (op.intAttr(name) < 1)
        ctx.fail(attrPath(), "must be at least 1, got " + Twine(op.intAttr(name)));
    } else if (name == "aux_loss" || name == "scale") {
      double value = op.numberAttr(name);
      if (!(value >= 0 && std::isfinite(value)))
        ctx.fail(attrPath(), "must be finite and not negative, got " + numberText(value));
    } else if (name == "eps" || name == "theta") {
      double value = op.numberAttr(name);
      if (!(value > 0 && std::isfinite(value)))
        ctx.fail(attrPath(), "must be positive, got " + numberText(value));
    } else if (name == "peer") {
      // Checked after the group, which must exist: a position in this rank's group list.
      int64_t peer = op.intAttr(name);
      Group group = op.groupAttr("group");
      size_t members = plan.groups.get(group).size();
      if (!ctx.failed() && (peer < 0 || peer >= int64_t(members)))
        ctx.fail(attrPath(), Twine(peer) + " is not a position in this rank's " +
                                 spelling(group) + " group of " + Twine(members));
    } else if (name == "offset") {
      // The position of the first row: the rows must lie inside the sequence.
      int64_t offset = op.intAttr(name);
      const std::vector<int64_t> &shape = chunk.tensors.at(op.inputs.front()).shape;
      int64_t rows = shape.empty() ? 0 : shape.front();
      if (offset < 0 || rows > plan.model.seq || offset > plan.model.seq - rows)
        ctx.fail(attrPath(), "rows " + Twine(offset) + " to " + Twine(offset + rows) +
                                 " lie outside the sequence of " + Twine(plan.model.seq));
    } else if (name == "dim") {
      const std::string &tensor = op.kind == OpKind::SplitBwd || op.kind == OpKind::Concat
                                      ? op.outputs.front()
                                      : op.inputs.front();
      int64_t dim = op.intAttr(name);
      size_t dims = rankOf(tensor);
      if (dim < 0 || dim >= int64_t(dims))
        ctx.fail(attrPath(), "dimension " + Twine(dim) + " does not exist in '" + tensor +
                                 "', which has " + Twine(dims));
    }
  }
  bool attention = op.kind == OpKind::Attention || op.kind == OpKind::AttentionBwd ||
                   op.kind == OpKind::AttentionBlock || op.kind == OpKind::AttentionBlockBwd;
  if (!ctx.failed() && attention &&
      op.intAttr("heads") % op.intAttr("kv_heads") != 0)
    ctx.fail(fieldPath(attrsPath(), "kv_heads"),
             "kv_heads = " + Twine(op.intAttr("kv_heads")) +
                 " does not divide heads = " + Twine(op.intAttr("heads")));
}

void ChunkFlow::checkOp(const Op &op, StringRef list, size_t index, bool backward) {
  auto opPath = [&] { return indexPath(fieldPath(path, list), index); };
  if (!checkOpSignature(ctx, op, opPath))
    return;
  if (!backward && opInfo(op.kind).backwardOnly)
    ctx.fail(fieldPath(opPath(), "op"), "'" + spelling(op.kind) + "' is a backward op; it " +
                                            "belongs in the chunk's \"backward\" list");
  for (size_t j = 0; j < op.inputs.size() && !ctx.failed(); ++j) {
    const std::string &name = op.inputs[j];
    auto operand = [&] { return indexPath(fieldPath(opPath(), "inputs"), j); };
    // The most frequent cases first: operand checks dominate verifying a large plan.
    if (isParam(name))
      continue;
    if (isParamGrad(name))
      ctx.fail(operand(), "reads the parameter gradient '" + name + "', which is complete " +
                              "only after the step's last backward");
    else if (!chunk.tensors.count(name))
      ctx.fail(operand(), "'" + name + "' is neither a parameter nor in the chunk's tensors");
    else if (!defined.count(name))
      ctx.fail(operand(), "'" + name + "' is read before any op writes it");
  }
  for (size_t j = 0; j < op.outputs.size() && !ctx.failed(); ++j) {
    const std::string &name = op.outputs[j];
    auto operand = [&] { return indexPath(fieldPath(opPath(), "outputs"), j); };
    if (isParamGrad(name)) {
      if (!backward)
        ctx.fail(operand(), "a forward op cannot write the parameter gradient '" + name + "'");
      else
        gradsWritten.insert(name);
    } else if (isParam(name)) {
      ctx.fail(operand(), "writes the parameter '" + name + "'; parameters change only in " +
                              "optimizer_step");
    } else if (!chunk.tensors.count(name)) {
      ctx.fail(operand(),
               "'" + name + "' is neither a parameter gradient nor in the chunk's " + "tensors");
    } else if (!defined.insert(name).second) {
      ctx.fail(operand(),
               "'" + name + "' is written twice; only parameter gradients " + "accumulate");
    }
  }
  if (!ctx.failed())
    checkAttrs(op, opPath);
  bool gradient = false;
  if (!ctx.failed())
    checkInputRoles(op, opPath, gradient);
  if (!ctx.failed())
    checkOutputRoles(op, opPath, gradient);
  if (!ctx.failed())
    checkShapes(op, opPath);
}

/// The roles of OpInfo: which operands are values, parameters, ids or gradients. Sets
/// `gradient` when the op's 'u' inputs are gradients.
void ChunkFlow::checkInputRoles(const Op &op, llvm::function_ref<std::string()> opPath,
                                bool &gradient) {
  const OpInfo &info = opInfo(op.kind);
  std::optional<bool> uniform;
  for (size_t j = 0; j < op.inputs.size() && !ctx.failed(); ++j) {
    const std::string &name = op.inputs[j];
    auto operand = [&] { return indexPath(fieldPath(opPath(), "inputs"), j); };
    char role = info.inputRole(j);
    bool isGradient = gradients.count(name);
    if (received.count(name) && (role == 'v' || role == 'g' || role == 'u'))
      continue;
    if (role == 'c' || (role == 'r' && isCounts(name))) {
      if (!isCounts(name))
        ctx.fail(operand(), "'" + name + "' is not row counts (an int64 tensor that " +
                                "moe_counts or all_to_all writes)");
    } else if (isCounts(name)) {
      ctx.fail(operand(), "'" + name + "' holds row counts, which only the counts operand of " +
                              "expert_matmul, expert_matmul_bwd and all_to_all reads");
    } else if (role == 'i' || isIds(name)) {
      if (role != 'i')
        ctx.fail(operand(), "'" + name + "' holds token ids, which only the ids operand of " +
                                "embedding, embedding_bwd, cross_entropy and " +
                                "cross_entropy_bwd reads");
      else if (!isIds(name))
        ctx.fail(operand(), "'" + name + "' is not token ids (the int64 tokens or labels)");
    } else if (role == 'p' && !isParam(name)) {
      ctx.fail(operand(), "'" + name + "' is not a parameter, where '" + spelling(op.kind) +
                              "' takes one (a weight this rank owns)");
    } else if ((role == 'v' || role == 'r') && isGradient) {
      ctx.fail(operand(), "'" + name + "' is a gradient, where '" + spelling(op.kind) +
                              "' takes a value (an activation or a parameter); are the inputs "
                              "swapped?");
    } else if (role == 'g' && !isGradient) {
      ctx.fail(operand(), "'" + name + "' is not a gradient, where '" + spelling(op.kind) +
                              "' takes one; are the inputs swapped?");
    } else if (role == 'u') {
      if (uniform && *uniform != isGradient)
        ctx.fail(operand(), "'" + name + "' is " + (isGradient ? "a gradient" : "a value") +
                                " but input 0 is " + (isGradient ? "a value" : "a gradient") +
                                "; '" + spelling(op.kind) + "' combines either values or "
                                "gradients");
      uniform = isGradient;
    }
  }
  gradient = uniform.value_or(false);
}

void ChunkFlow::checkOutputRoles(const Op &op, llvm::function_ref<std::string()> opPath,
                                 bool gradient) {
  const OpInfo &info = opInfo(op.kind);
  for (size_t j = 0; j < op.outputs.size() && !ctx.failed(); ++j) {
    const std::string &name = op.outputs[j];
    auto operand = [&] { return indexPath(fieldPath(opPath(), "outputs"), j); };
    char role = info.outputRole(j);
    bool paramGrad = isParamGrad(name);
    if (role == 'c') {
      if (!isCounts(name))
        ctx.fail(operand(), "'" + name + "' must be declared int64: '" + spelling(op.kind) +
                                "' writes row counts here");
    } else if (isInt64(name)) {
      ctx.fail(operand(), "'" + name + "' is declared int64; ops write only floating-point "
                                       "tensors, except the row counts of moe_counts and "
                                       "all_to_all");
    } else if (role == 'v' || (role == 'u' && !gradient)) {
      if (paramGrad)
        ctx.fail(operand(), "'" + spelling(op.kind) + "' computes a value here, not the " +
                                "parameter gradient '" + name + "'");
    } else if (role == 'g' && paramGrad) {
      ctx.fail(operand(), "'" + name + "' is a parameter gradient, where '" + spelling(op.kind) +
                              "' computes the gradient of an activation");
    } else if (llvm::isDigit(role)) {
      // A parameter's gradient may also go to a tensor that a later op sums into it.
      const std::string &of = op.inputs[size_t(role - '0')];
      if (paramGrad && name != gradName(of))
        ctx.fail(operand(), "'" + spelling(op.kind) + "' writes the gradient of input " +
                                Twine(role - '0') + ", '" + of + "', here: expected " +
                                (isParam(of) ? "'" + gradName(of) + "' or a tensor"
                                             : std::string("an activation's gradient")) +
                                ", got the parameter gradient '" + name + "'");
    }
    if (op.kind == OpKind::Recv)
      received.insert(name);
    else if (role != 'v' && role != 'c' && (role != 'u' || gradient))
      gradients.insert(name);
  }
}

void ChunkFlow::checkShapes(const Op &op, llvm::function_ref<std::string()> opPath) {
  llvm::SmallVector<OperandShape, 4> inputs, outputs;
  for (const std::string &name : op.inputs)
    inputs.push_back(shapeOf(name));
  for (const std::string &name : op.outputs)
    outputs.push_back(shapeOf(name));
  checkOpShapes(ctx, plan, op, inputs, outputs, opPath);
}

void ChunkFlow::requireWritten(StringRef name, StringRef list, StringRef why) {
  if (!ctx.failed() && !defined.count(name))
    ctx.fail(fieldPath(path, list), "no op writes '" + name + "', " + why);
}

void ChunkFlow::run() {
  checkTable();
  if (ctx.failed())
    return;
  if (!chunk.input.empty())
    defined.insert(chunk.input);
  if (chunk.hasEmbedding)
    defined.insert("tokens");
  if (chunk.hasHead)
    defined.insert("labels");
  for (size_t i = 0; i < chunk.forward.size() && !ctx.failed(); ++i)
    checkOp(chunk.forward[i], "forward", i, /*backward=*/false);
  if (chunk.hasHead)
    requireWritten("loss", "forward", "the loss the head chunk must compute");
  else
    requireWritten(chunk.output, "forward", "the activation the chunk sends");
  std::string seed = chunk.hasHead ? "loss.grad" : gradName(chunk.output);
  defined.insert(seed);
  gradients.insert(seed);
  for (size_t i = 0; i < chunk.backward.size() && !ctx.failed(); ++i)
    checkOp(chunk.backward[i], "backward", i, /*backward=*/true);
  if (!chunk.input.empty())
    requireWritten(gradName(chunk.input), "backward",
                   "the gradient the chunk sends to the previous stage");
}

std::string countText(int count, StringRef what) {
  if (count == OpInfo::AtLeastTwo)
    return ("at least 2 " + what + "s").str();
  return (Twine(count) + " " + what + (count == 1 ? "" : "s")).str();
}

bool countMatches(int expected, size_t actual) {
  return expected == OpInfo::AtLeastTwo ? actual >= 2 : actual == size_t(expected);
}

bool attrHasType(const AttrValue &value, AttrType type) {
  switch (type) {
  case AttrType::Bool:
    return std::holds_alternative<bool>(value);
  case AttrType::Int:
    return std::holds_alternative<int64_t>(value);
  case AttrType::Number:
    return std::holds_alternative<double>(value);
  case AttrType::Group:
    return std::holds_alternative<std::string>(value) &&
           parseSpelling<Group>(std::get<std::string>(value));
  }
  return false;
}

} // namespace

bool checkOpSignature(ReadContext &ctx, const Op &op, llvm::function_ref<std::string()> opPath) {
  const OpInfo &info = opInfo(op.kind);
  StringRef kind = spelling(op.kind);
  if (!countMatches(info.inputs, op.inputs.size()))
    return ctx.fail(fieldPath(opPath(), "inputs"), "'" + kind + "' takes " +
                                                       countText(info.inputs, "input") + ", got " +
                                                       Twine(op.inputs.size()));
  if (!countMatches(info.outputs, op.outputs.size()))
    return ctx.fail(fieldPath(opPath(), "outputs"), "'" + kind + "' produces " +
                                                        countText(info.outputs, "output") +
                                                        ", got " + Twine(op.outputs.size()));
  auto attrsPath = [&] { return fieldPath(opPath(), "attrs"); };
  for (const AttrSpec &spec : info.attrs) {
    auto it = op.attrs.find(spec.name.str());
    if (it == op.attrs.end())
      return ctx.fail(fieldPath(attrsPath(), spec.name), "missing required field");
    if (!attrHasType(it->second, spec.type))
      return ctx.fail(fieldPath(attrsPath(), spec.name), "expected " + spelling(spec.type));
  }
  for (const auto &entry : op.attrs)
    if (llvm::none_of(info.attrs, [&](const AttrSpec &spec) { return spec.name == entry.first; }))
      return ctx.fail(fieldPath(attrsPath(), entry.first),
                      "'" + kind + "' has no attribute '" + entry.first + "'");
  return true;
}

void checkDataflow(ReadContext &ctx, const RankPlan &plan) {
  ParamShapes params;
  for (const ParamShard &param : plan.params)
    params[param.name] = param.localShape();
  llvm::StringSet<> gradsWritten;
  for (size_t i = 0; i < plan.chunks.size() && !ctx.failed(); ++i)
    ChunkFlow(ctx, plan, plan.chunks[i], indexPath("chunks", i), params, gradsWritten).run();
  for (size_t i = 0; i < plan.params.size() && !ctx.failed(); ++i)
    if (!gradsWritten.count(gradName(plan.params[i].name)))
      ctx.fail(indexPath("params", i), "no chunk's backward writes '" +
                                           gradName(plan.params[i].name) +
                                           "'; a parameter this rank owns must receive a gradient");
}

} // namespace parc::plan::detail
