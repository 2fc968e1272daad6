//===- MoELowering.cpp - The op lists of a mixture-of-experts MLP ---------===//
//
// Megatron-Core's MoE layer as explicit ops, on one expert-parallel rank (ep = tp = 1, which
// checkLowerable requires): the router's logits, the tokens' rows dispatched to their top_k
// experts (grouped by expert), each expert's MLP over its rows, the rows combined back per
// token weighted by the router, and the shared experts as a dense MLP beside them. Every MoE
// op routes from the logits itself, so no routing table is a tensor of the plan.
//
// Backward: the combine's gradient reaches the expert rows and, through the top-k weights,
// the logits; the load-balancing loss adds its own gradient of the logits (scaled as the loss
// gradient is seeded, 1 / microbatches); ln2's gradient sums the experts', the router's and
// the shared experts' parts.
//
//===----------------------------------------------------------------------===//
#include "ChunkLowerer.h"

namespace parc::lower {

namespace {
Attrs routeAttrs(const MoESpec &moe) { return {{"top_k", moe.topK}}; }
Attrs combineAttrs(const MoESpec &moe) {
  return {{"top_k", moe.topK}, {"normalize", moe.normalizeTopK}};
}
std::string expertWeight(int64_t block, llvm::StringRef leaf) {
  return blockName(block, "moe.experts." + leaf.str() + ".weight");
}
} // namespace

std::string ChunkLowerer::moeForward(int64_t block, const BlockDims &dims, BlockActivations &a,
                                     llvm::StringRef sfx, bool forRecompute) {
  const MoESpec &moe = dims.moe;
  auto name = [&](llvm::StringRef leaf) { return blockName(block, leaf) + sfx.str(); };
  const int64_t rows = job.seq * job.microBatch * moe.topK, f = moe.ffn;
  const bool swiglu = dims.mlp == MLPKind::SwiGLU;
  MoEActivations &m = a.moe;

  m.logits = activation(name("moe.logits"), job.seq, moe.experts);
  emit(OpKind::MatMul, {a.mlpInput, blockName(block, "moe.router.weight")}, {m.logits},
       linearAttrs);
  m.rows = declare(name("moe.rows"), {rows, job.hidden}, job.dtype);
  emit(OpKind::MoeDispatch, {a.mlpInput, m.logits}, {m.rows}, routeAttrs(moe));
  auto experts = [&](llvm::StringRef leaf, const std::string &x, int64_t width) {
    std::string y = declare(name("moe." + leaf.str()), {rows, width}, job.dtype);
    emit(OpKind::ExpertMatMul, {x, m.logits, expertWeight(block, leaf)}, {y}, routeAttrs(moe));
    return y;
  };
  if (swiglu)
    m.gate = experts("gate", m.rows, f);
  m.up = experts("up", m.rows, f);
  m.activated = declare(name("moe.act"), {rows, f}, job.dtype);
  if (swiglu)
    emit(OpKind::SwiGLU, {m.gate, m.up}, {m.activated});
  else
    emit(OpKind::GELU, {m.up}, {m.activated});
  m.down = experts("down", m.activated, job.hidden);

  const int64_t shared = moe.sharedFfn();
  if (shared) {
    if (swiglu)
      m.sharedGate =
          columnForward(a.mlpInput, blockName(block, "moe.shared.gate"), shared, job.biases, sfx);
    m.sharedUp =
        columnForward(a.mlpInput, blockName(block, "moe.shared.up"), shared, job.biases, sfx);
    m.sharedActivated = activation(name("moe.shared.act"), job.seq, shared);
    if (swiglu)
      emit(OpKind::SwiGLU, {m.sharedGate, m.sharedUp}, {m.sharedActivated});
    else
      emit(OpKind::GELU, {m.sharedUp}, {m.sharedActivated});
  }
  // The backward reads neither the combine's output nor the shared down projection's.
  if (forRecompute)
    return "";
  std::string out = activation(name("moe.out"), job.seq, job.hidden);
  emit(OpKind::MoeCombine, {m.down, m.logits}, {out}, combineAttrs(moe));
  if (!shared)
    return out;
  std::string sharedOut = rowForward(m.sharedActivated, blockName(block, "moe.shared.down"), sfx);
  std::string sum = activation(name("moe.mlp"), job.seq, job.hidden);
  emit(OpKind::ResidualAdd, {out, sharedOut}, {sum});
  return sum;
}

void ChunkLowerer::moeBackward(int64_t block, const BlockDims &dims, const BlockActivations &saved,
                               const std::string &dOut) {
  const MoESpec &moe = dims.moe;
  const MoEActivations &m = saved.moe;
  auto name = [&](llvm::StringRef leaf) { return blockName(block, leaf); };
  const bool swiglu = dims.mlp == MLPKind::SwiGLU;

  std::string dCombined = dOut;
  if (moe.sharedExperts) {
    dCombined = gradOf(name("moe.out"));
    emit(OpKind::ResidualAddBwd, {dOut}, {dCombined, gradOf(name("moe.shared.down"))});
  }
  // The logits' gradient: through the top-k weights, plus the load-balancing loss's.
  std::string dLogits = gradOf(name("moe.logits"));
  std::string dRouted = moe.auxLoss > 0 ? declare(dLogits + ".combine",
                                                  {job.seq, job.microBatch, moe.experts}, job.dtype)
                                        : dLogits;
  emit(OpKind::MoeCombineBwd, {m.down, m.logits, dCombined}, {gradOf(name("moe.down")), dRouted},
       combineAttrs(moe));
  if (moe.auxLoss > 0) {
    std::string dAux = declare(dLogits + ".aux", {job.seq, job.microBatch, moe.experts}, job.dtype);
    emit(OpKind::MoeAuxLossBwd, {m.logits}, {dAux},
         {{"top_k", moe.topK},
          {"aux_loss", moe.auxLoss},
          {"scale", 1.0 / double(job.mapping.microbatches)}});
    emit(OpKind::ResidualAdd, {dRouted, dAux}, {dLogits});
  }

  auto expertsBackward = [&](llvm::StringRef leaf, const std::string &x, const std::string &dx) {
    std::string weight = expertWeight(block, leaf);
    emit(OpKind::ExpertMatMulBwd, {x, m.logits, weight, plan::gradName(name("moe." + leaf.str()))},
         {dx, plan::gradName(weight)}, routeAttrs(moe));
  };
  std::string dActivated = gradOf(name("moe.act"));
  expertsBackward("down", m.activated, dActivated);
  std::string dRows = gradOf(name("moe.rows"));
  if (swiglu) {
    emit(OpKind::SwiGLUBwd, {m.gate, m.up, dActivated},
         {gradOf(name("moe.gate")), gradOf(name("moe.up"))});
    // gate and up each contribute a part of the rows' gradient.
    for (llvm::StringRef part : {"gate", "up"})
      expertsBackward(part, m.rows, declare(dRows + "." + part.str(),
                                            {job.seq * job.microBatch * moe.topK, job.hidden},
                                            job.dtype));
    emit(OpKind::ResidualAdd, {dRows + ".gate", dRows + ".up"}, {dRows});
  } else {
    emit(OpKind::GELUBwd, {m.up, dActivated}, {gradOf(name("moe.up"))});
    expertsBackward("up", m.rows, dRows);
  }

  // ln2's gradient: the experts', the router's and the shared experts' parts.
  std::string dInput = columnInputGrad(name("ln2"));
  auto part = [&](llvm::StringRef leaf) {
    return declare(dInput + "." + leaf.str(), {job.seq, job.microBatch, job.hidden}, job.dtype);
  };
  std::vector<std::string> parts = {part("experts"), part("router")};
  emit(OpKind::MoeDispatchBwd, {dRows, m.logits}, {parts[0]}, routeAttrs(moe));
  std::string router = name("moe.router.weight");
  emit(OpKind::MatMulBwd, {saved.mlpInput, router, dLogits}, {parts[1], plan::gradName(router)},
       linearAttrs);
  if (moe.sharedExperts) {
    std::string dShared =
        rowBackward(m.sharedActivated, name("moe.shared.act"), name("moe.shared.down"));
    if (swiglu)
      emit(OpKind::SwiGLUBwd, {m.sharedGate, m.sharedUp, dShared},
           {gradOf(name("moe.shared.gate")), gradOf(name("moe.shared.up"))});
    else
      emit(OpKind::GELUBwd, {m.sharedUp, dShared}, {gradOf(name("moe.shared.up"))});
    for (llvm::StringRef layer : {"gate", "up"}) {
      if (layer == "gate" && !swiglu)
        continue;
      std::string prefix = name("moe.shared." + layer.str());
      parts.push_back(part("shared." + layer.str()));
      columnBackward(saved.mlpInput, prefix, parts.back(), plan::gradName(prefix + ".weight"),
                     job.biases ? plan::gradName(prefix + ".bias") : "");
    }
  }
  std::string sum = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string next = i + 1 == parts.size() ? dInput : part("sum" + std::to_string(i));
    emit(OpKind::ResidualAdd, {sum, parts[i]}, {next});
    sum = next;
  }
}

} // namespace parc::lower
