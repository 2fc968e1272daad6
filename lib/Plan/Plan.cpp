//===- Plan.cpp - Spellings, op signatures and helpers of the plan IR ------===//

#include "parc/Plan/Plan.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

using llvm::ArrayRef;
using llvm::StringLiteral;
using llvm::StringRef;

namespace parc::plan {

// Each table is indexed by the enumerator, so its order must follow the enum declaration.
ArrayRef<StringLiteral> spellings(DType) {
  static constexpr StringLiteral names[] = {"fp32", "bf16", "fp16", "int64"};
  return names;
}
ArrayRef<StringLiteral> spellings(Norm) {
  static constexpr StringLiteral names[] = {"layernorm", "rmsnorm"};
  return names;
}
ArrayRef<StringLiteral> spellings(MLP) {
  static constexpr StringLiteral names[] = {"gelu", "swiglu"};
  return names;
}
ArrayRef<StringLiteral> spellings(Position) {
  static constexpr StringLiteral names[] = {"learned", "rope"};
  return names;
}
ArrayRef<StringLiteral> spellings(Schedule) {
  static constexpr StringLiteral names[] = {"gpipe", "1f1b", "interleaved"};
  return names;
}
ArrayRef<StringLiteral> spellings(Recompute) {
  static constexpr StringLiteral names[] = {"none", "selective", "full"};
  return names;
}
ArrayRef<StringLiteral> spellings(Optimizer) {
  static constexpr StringLiteral names[] = {"adam", "sgd"};
  return names;
}
ArrayRef<StringLiteral> spellings(Group) {
  static constexpr StringLiteral names[] = {"tp",        "pp", "dp",   "model",
                                            "embedding", "cp", "dp_cp", "ep",
                                            "expert_dp"};
  return names;
}
ArrayRef<StringLiteral> spellings(ShardKind) {
  static constexpr StringLiteral names[] = {"column", "row", "vocab", "replicated"};
  return names;
}
ArrayRef<StringLiteral> spellings(InitKind) {
  static constexpr StringLiteral names[] = {"normal", "zeros", "ones"};
  return names;
}
ArrayRef<StringLiteral> spellings(OpKind) {
  static constexpr StringLiteral names[] = {"embedding",
                                            "position_embedding",
                                            "layernorm",
                                            "rmsnorm",
                                            "matmul",
                                            "bias_add",
                                            "rope",
                                            "attention",
                                            "gelu",
                                            "swiglu",
                                            "residual_add",
                                            "split",
                                            "all_reduce",
                                            "all_gather",
                                            "reduce_scatter",
                                            "cross_entropy",
                                            "embedding_bwd",
                                            "position_embedding_bwd",
                                            "layernorm_bwd",
                                            "rmsnorm_bwd",
                                            "matmul_bwd",
                                            "bias_add_bwd",
                                            "rope_bwd",
                                            "attention_bwd",
                                            "gelu_bwd",
                                            "swiglu_bwd",
                                            "residual_add_bwd",
                                            "split_bwd",
                                            "cross_entropy_bwd",
                                            "send",
                                            "recv",
                                            "concat",
                                            "attention_block",
                                            "attention_merge",
                                            "attention_block_bwd",
                                            "moe_dispatch",
                                            "expert_matmul",
                                            "moe_combine",
                                            "moe_dispatch_bwd",
                                            "expert_matmul_bwd",
                                            "moe_combine_bwd",
                                            "moe_aux_loss_bwd",
                                            "moe_counts",
                                            "all_to_all"};
  static_assert(std::size(names) == size_t(OpKind::AllToAll) + 1);
  return names;
}
ArrayRef<StringLiteral> spellings(InstrKind) {
  static constexpr StringLiteral names[] = {"load_batch",
                                            "fwd",
                                            "bwd",
                                            "send_act",
                                            "recv_act",
                                            "send_grad",
                                            "recv_grad",
                                            "all_reduce_grads",
                                            "reduce_scatter_grads",
                                            "all_gather_params",
                                            "release_params",
                                            "optimizer_step"};
  static_assert(std::size(names) == size_t(InstrKind::OptimizerStep) + 1);
  return names;
}

StringRef spelling(AttrType type) {
  switch (type) {
  case AttrType::Bool:
    return "a boolean";
  case AttrType::Int:
    return "an integer";
  case AttrType::Number:
    return "a number";
  case AttrType::Group:
    return "a group name";
  }
  llvm_unreachable("unknown attribute type");
}

std::string rankFileName(int64_t rank) {
  std::string name;
  llvm::raw_string_ostream os(name);
  os << "rank-" << llvm::format("%05lld", static_cast<long long>(rank)) << ".json";
  return os.str();
}

std::string gradName(StringRef tensor) { return (tensor + ".grad").str(); }

//===----------------------------------------------------------------------===//
// Op signatures
//===----------------------------------------------------------------------===//

namespace {
constexpr AttrSpec vocabAttrs[] = {{"vocab_offset", AttrType::Int}};
constexpr AttrSpec epsAttrs[] = {{"eps", AttrType::Number}};
constexpr AttrSpec matmulAttrs[] = {{"trans_a", AttrType::Bool}, {"trans_b", AttrType::Bool}};
constexpr AttrSpec ropeAttrs[] = {
    {"heads", AttrType::Int}, {"offset", AttrType::Int}, {"theta", AttrType::Number}};
constexpr AttrSpec offsetAttrs[] = {{"offset", AttrType::Int}};
constexpr AttrSpec peerAttrs[] = {{"group", AttrType::Group}, {"peer", AttrType::Int}};
constexpr AttrSpec attentionAttrs[] = {{"causal", AttrType::Bool},
                                       {"flash", AttrType::Bool},
                                       {"heads", AttrType::Int},
                                       {"kv_heads", AttrType::Int}};
/// Ring attention's blocks always keep their rows' logsumexp, as FlashAttention does.
constexpr AttrSpec blockAttrs[] = {
    {"causal", AttrType::Bool}, {"heads", AttrType::Int}, {"kv_heads", AttrType::Int}};
constexpr AttrSpec dimAttrs[] = {{"dim", AttrType::Int}};
constexpr AttrSpec groupAttrs[] = {{"group", AttrType::Group}};
constexpr AttrSpec groupDimAttrs[] = {{"group", AttrType::Group}, {"dim", AttrType::Int}};
constexpr AttrSpec lossAttrs[] = {
    {"group", AttrType::Group}, {"vocab", AttrType::Int}, {"vocab_offset", AttrType::Int}};

/// The router's choice; normalize: the top-k weights divided by their sum.
constexpr AttrSpec routeAttrs[] = {{"top_k", AttrType::Int}};
constexpr AttrSpec combineAttrs[] = {{"top_k", AttrType::Int}, {"normalize", AttrType::Bool}};
/// aux_loss: the coefficient; scale: what the loss's gradient is seeded with (1 / microbatches).
constexpr AttrSpec auxLossAttrs[] = {
    {"top_k", AttrType::Int}, {"aux_loss", AttrType::Number}, {"scale", AttrType::Number}};

constexpr int many = OpInfo::AtLeastTwo;
} // namespace

const OpInfo &opInfo(OpKind kind) {
  // {inputs, outputs, backwardOnly, attrs, input roles, output roles} (OpInfo);
  // docs/plan-format.md names each operand.
  static const OpInfo table[] = {
      {2, 1, false, vocabAttrs, "ip", "v"},          // embedding: ids, weight -> y
      {2, 1, false, offsetAttrs, "vp", "v"},         // position_embedding: x, weight -> y
      {3, 1, false, epsAttrs, "vpp", "v"},           // layernorm: x, weight, bias -> y
      {2, 1, false, epsAttrs, "vp", "v"},            // rmsnorm: x, weight -> y
      {2, 1, false, matmulAttrs, "vp", "v"},         // matmul: a, b -> c
      {2, 1, false, {}, "vp", "v"},                  // bias_add: x, bias -> y
      {1, 1, false, ropeAttrs, "v", "v"},            // rope: x -> y
      {3, 2, false, attentionAttrs, "vvv", "vv"},    // attention: q, k, v -> y, stats
      {1, 1, false, {}, "v", "v"},                   // gelu
      {2, 1, false, {}, "vv", "v"},                  // swiglu: gate, up -> y
      {2, 1, false, {}, "uu", "u"},                  // residual_add: a, b -> y
      {1, many, false, dimAttrs, "u", "u"},          // split: x -> parts
      {1, 1, false, groupAttrs, "u", "u"},           // all_reduce
      {1, 1, false, groupDimAttrs, "u", "u"},        // all_gather
      {1, 1, false, groupDimAttrs, "u", "u"},        // reduce_scatter
      {2, 1, false, lossAttrs, "vi", "v"},           // cross_entropy: logits, labels -> loss
      {2, 1, true, vocabAttrs, "ig", "P"},           // embedding_bwd: ids, dy -> dweight
      {1, 2, true, offsetAttrs, "g", "gP"},          // position_embedding_bwd: dy -> dx, dweight
      {3, 3, true, epsAttrs, "vpg", "01P"},          // layernorm_bwd: x, weight, dy -> dx, dweight, dbias
      {3, 2, true, epsAttrs, "vpg", "01"},           // rmsnorm_bwd: x, weight, dy -> dx, dweight
      {3, 2, true, matmulAttrs, "vpg", "01"},        // matmul_bwd: a, b, dc -> da, db
      {1, 2, true, {}, "g", "gP"},                   // bias_add_bwd: dy -> dx, dbias
      {1, 1, true, ropeAttrs, "g", "g"},             // rope_bwd: dy -> dx
      {6, 3, true, attentionAttrs, "vvvvvg", "012"}, // attention_bwd: q, k, v, y, stats, dy -> dq, dk, dv
      {2, 1, true, {}, "vg", "0"},                   // gelu_bwd: x, dy -> dx
      {3, 2, true, {}, "vvg", "01"},                 // swiglu_bwd: gate, up, dy -> dgate, dup
      {1, 2, true, {}, "g", "gg"},                   // residual_add_bwd: dy -> da, db
      {many, 1, true, dimAttrs, "g", "g"},           // split_bwd: dparts -> dx
      {3, 1, true, lossAttrs, "vig", "0"},           // cross_entropy_bwd: logits, labels, dloss -> dlogits
      {1, 0, false, peerAttrs, "u", ""},             // send: x ->
      {0, 1, false, peerAttrs, "", "u"},             // recv: -> y
      {many, 1, false, dimAttrs, "u", "u"},          // concat: parts -> x
      {3, 2, false, blockAttrs, "vvv", "vv"},        // attention_block: q, k, v -> y, lse
      {4, 2, false, {}, "vvvv", "vv"},               // attention_merge: y1, lse1, y2, lse2 -> y, lse
      {6, 3, true, blockAttrs, "vvvvvg", "012"},     // attention_block_bwd: q, k, v, y, lse, dy -> dq, dk, dv
      {2, 1, false, routeAttrs, "vv", "v"},          // moe_dispatch: x, logits -> rows
      {3, 1, false, routeAttrs, "vrp", "v"},         // expert_matmul: rows, logits or counts, weight -> y
      {2, 1, false, combineAttrs, "vv", "v"},        // moe_combine: y, logits -> out
      {2, 1, true, routeAttrs, "gv", "g"},           // moe_dispatch_bwd: drows, logits -> dx
      {4, 2, true, routeAttrs, "vrpg", "02"},        // expert_matmul_bwd: rows, logits or counts, weight, dy -> drows, dweight
      {3, 2, true, combineAttrs, "vvg", "01"},       // moe_combine_bwd: y, logits, dout -> dy, dlogits
      {1, 1, true, auxLossAttrs, "v", "0"},          // moe_aux_loss_bwd: logits -> dlogits
      {1, 1, false, routeAttrs, "v", "c"},           // moe_counts: logits -> counts
      {2, 2, false, groupAttrs, "uc", "uc"},         // all_to_all: x, counts -> y, counts
  };
  static_assert(std::size(table) == size_t(OpKind::AllToAll) + 1);
  return table[static_cast<size_t>(kind)];
}

namespace {
template <typename T> const T &attrAs(const Op &op, StringRef name) {
  // An op has at most a few attributes, and the runtime reads them at every op: a scan of
  // StringRef compares, no std::string built for map::find.
  auto it = llvm::find_if(op.attrs, [&](const auto &attr) { return attr.first == name; });
  if (it == op.attrs.end() || !std::holds_alternative<T>(it->second))
    llvm::report_fatal_error("plan op '" + spelling(op.kind) + "' has no attribute '" + name +
                             "' of the requested type; was the plan read and verified?");
  return std::get<T>(it->second);
}
} // namespace

bool Op::boolAttr(StringRef name) const { return attrAs<bool>(*this, name); }
int64_t Op::intAttr(StringRef name) const { return attrAs<int64_t>(*this, name); }
double Op::numberAttr(StringRef name) const { return attrAs<double>(*this, name); }
Group Op::groupAttr(StringRef name) const {
  std::optional<Group> group = parseSpelling<Group>(attrAs<std::string>(*this, name));
  if (!group)
    llvm::report_fatal_error("plan op '" + spelling(kind) + "' attribute '" + name +
                             "' is not a group name");
  return *group;
}

//===----------------------------------------------------------------------===//
// Small helpers
//===----------------------------------------------------------------------===//

const std::vector<int64_t> &Groups::get(Group group) const {
  switch (group) {
  case Group::TP:
    return tp;
  case Group::PP:
    return pp;
  case Group::DP:
    return dp;
  case Group::Model:
    return model;
  case Group::Embedding:
    return embedding;
  case Group::CP:
    return cp;
  case Group::DPCP:
    return dpCp;
  case Group::EP:
    return ep;
  case Group::ExpertDP:
    return expertDp;
  }
  llvm_unreachable("unknown group");
}

std::vector<int64_t> &Groups::get(Group group) {
  return const_cast<std::vector<int64_t> &>(static_cast<const Groups *>(this)->get(group));
}

int64_t averagingDivisor(const RankPlan &plan, Group group) {
  if (group == Group::ExpertDP)
    return plan.parallel.dp * plan.parallel.cp;
  return int64_t(plan.groups.get(group).size());
}

std::vector<int64_t> ParamShard::localShape() const {
  std::vector<int64_t> shape;
  for (const Slice &s : slice)
    shape.push_back(s.size);
  return shape;
}

const ParamShard *RankPlan::findParam(StringRef name) const {
  for (const ParamShard &param : params)
    if (param.name == name)
      return &param;
  return nullptr;
}

Instr Instr::loadBatch(int64_t microbatch) {
  Instr instr;
  instr.op = InstrKind::LoadBatch;
  instr.microbatch = microbatch;
  return instr;
}

Instr Instr::compute(InstrKind op, int64_t chunk, int64_t microbatch) {
  Instr instr;
  instr.op = op;
  instr.chunk = chunk;
  instr.microbatch = microbatch;
  return instr;
}

Instr Instr::transfer(InstrKind op, int64_t peer, int64_t chunk, int64_t microbatch) {
  Instr instr = compute(op, chunk, microbatch);
  instr.peer = peer;
  return instr;
}

Instr Instr::gradCollective(InstrKind op, Group group, bool average,
                            std::vector<std::string> params, bool within) {
  Instr instr;
  instr.op = op;
  instr.group = group;
  instr.average = average;
  instr.params = std::move(params);
  instr.within = within && op == InstrKind::ReduceScatterGrads;
  return instr;
}

Instr Instr::allGatherParams(Group group, std::vector<std::string> params, bool within) {
  Instr instr;
  instr.op = InstrKind::AllGatherParams;
  instr.group = group;
  instr.params = std::move(params);
  instr.within = within;
  return instr;
}

Instr Instr::releaseParams(std::vector<std::string> params, bool within) {
  Instr instr;
  instr.op = InstrKind::ReleaseParams;
  instr.params = std::move(params);
  instr.within = within;
  return instr;
}

Instr Instr::optimizerStep(std::vector<Group> normGroups) {
  Instr instr;
  instr.op = InstrKind::OptimizerStep;
  instr.normGroups = std::move(normGroups);
  return instr;
}

bool isTransfer(InstrKind op) {
  return op == InstrKind::SendAct || op == InstrKind::RecvAct || op == InstrKind::SendGrad ||
         op == InstrKind::RecvGrad;
}

bool isCompute(InstrKind op) { return op == InstrKind::Forward || op == InstrKind::Backward; }

bool usesParams(InstrKind op) {
  return op == InstrKind::AllReduceGrads || op == InstrKind::ReduceScatterGrads ||
         op == InstrKind::AllGatherParams || op == InstrKind::ReleaseParams;
}

bool mayRunWithin(InstrKind op) {
  return op == InstrKind::ReduceScatterGrads || op == InstrKind::AllGatherParams ||
         op == InstrKind::ReleaseParams;
}

std::vector<std::vector<OpRun>> readRuns(llvm::ArrayRef<Op> ops,
                                         llvm::ArrayRef<GatheredList> lists) {
  llvm::StringMap<size_t> listOf;
  for (size_t l = 0; l < lists.size(); ++l)
    for (const std::string &name : *lists[l].params)
      listOf.try_emplace(name, l);
  std::vector<std::vector<OpRun>> runs(lists.size());
  // The list of each group read last, and the op of that read.
  std::map<Group, size_t> current;
  for (size_t i = 0; i < ops.size(); ++i)
    for (const std::string &input : ops[i].inputs) {
      auto found = listOf.find(input);
      if (found == listOf.end())
        continue;
      size_t l = found->second;
      auto [open, fresh] = current.try_emplace(lists[l].group, l);
      if (!fresh && open->second == l) { // the run of this list's last read goes on
        runs[l].back().last = i;
        continue;
      }
      open->second = l;
      runs[l].push_back({i, i});
    }
  return runs;
}

int64_t WithinGathers::indexOf(const std::vector<std::string> &params) const {
  for (size_t l = 0; l < lists.size(); ++l)
    if (*lists[l].params == params)
      return int64_t(l);
  return -1;
}

WithinGathers gatheredWithin(llvm::ArrayRef<Instr> schedule, size_t compute) {
  size_t first = compute;
  while (first > 0 && schedule[first - 1].within &&
         schedule[first - 1].op == InstrKind::AllGatherParams)
    --first;
  WithinGathers result;
  for (size_t i = first; i < compute; ++i) {
    int64_t l = result.indexOf(schedule[i].params);
    if (l < 0) {
      l = int64_t(result.lists.size());
      result.lists.push_back({&schedule[i].params, schedule[i].group});
      result.gathers.push_back(0);
    }
    ++result.gathers[size_t(l)];
  }
  return result;
}

} // namespace parc::plan
