//===- MoELowering.cpp - The op lists of a mixture-of-experts MLP ---------===//
//
// Megatron-Core's MoE layer as explicit ops: the router's logits, the tokens' rows dispatched
// to their top_k experts (grouped by expert), each expert's MLP over its rows, the rows
// combined back per token weighted by the router, and the shared experts as a dense MLP
// beside them. Every MoE op routes from the logits itself, so no routing table is a tensor
// of the plan.
//
// Expert parallelism (ep > 1, the experts split over the ep group, experts / ep each): the
// dispatched rows are grouped by expert, so the rows for each ep member's experts are one
// block; moe_counts counts them per (member, expert) and an all_to_all over ep moves them
// (dropless: the counts are exchanged first, the receive buffer holds the worst case). The
// experts multiply the rows they received in blocks per (sender, expert), a second
// all_to_all returns the outputs in the blocks they came in, and the combine proceeds on the
// token's own rank as with ep = 1. The backward runs both exchanges transposed.
//
// Expert tensor parallelism is tp (Megatron-Core's default): every tp rank sees the whole
// sequence (ln2's output, all-gathered under sequence parallelism) and the same router, so
// all of them route alike; each holds a column slice of every expert's gate and up and a row
// slice of its down projection, so the combined output is partial over tp until the
// reduction a row-parallel layer ends with.
//
// Backward: the combine's gradient reaches the expert rows and, through the top-k weights,
// the logits (partial over tp, as the expert outputs are, so all-reduced); the load-balancing
// loss adds its own gradient of the logits (scaled as the loss gradient is seeded, 1 /
// microbatches); ln2's gradient sums the experts' and shared experts' parts (partial over
// tp, then reduced) and the router's (complete on every tp rank, so added after).
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
/// The rows a rank's experts multiply per microbatch: its own tokens' top_k rows with ep = 1;
/// with ep > 1 the all-to-all's buffer, which dropless routing fills at most with every
/// token of the ep group that routes to min(top_k, experts / ep) of the rank's experts
/// (MemoryModel's ExpertRows::bound).
int64_t expertRowsOf(const Job &job, const MoESpec &moe) {
  const int64_t tokens = job.seq * job.microBatch;
  return job.ep == 1 ? tokens * moe.topK
                     : job.ep * tokens * std::min(moe.topK, moe.experts / job.ep);
}
} // namespace

std::string ChunkLowerer::exchangeRows(const std::string &x, const std::string &counts,
                                       const std::string &y, int64_t rows, int64_t width,
                                       int64_t localExperts) {
  declare(y, {rows, width}, job.dtype);
  std::string received = declare(y + ".counts", {job.ep, localExperts}, plan::DType::Int64);
  emit(OpKind::AllToAll, {x, counts}, {y, received}, groupAttrs(plan::Group::EP));
  return received;
}

std::string ChunkLowerer::moeForward(int64_t block, const BlockDims &dims, BlockActivations &a,
                                     llvm::StringRef sfx, bool forRecompute) {
  const MoESpec &moe = dims.moe;
  auto name = [&](llvm::StringRef leaf) { return blockName(block, leaf) + sfx.str(); };
  const int64_t rows = job.seq * job.microBatch * moe.topK, f = moe.ffn / job.tp;
  const bool swiglu = dims.mlp == MLPKind::SwiGLU;
  MoEActivations &m = a.moe;

  m.logits = activation(name("moe.logits"), job.seq, moe.experts);
  emit(OpKind::MatMul, {a.mlpInput, blockName(block, "moe.router.weight")}, {m.logits},
       linearAttrs);
  m.rows = declare(name("moe.rows"), {rows, job.hidden}, job.dtype);
  emit(OpKind::MoeDispatch, {a.mlpInput, m.logits}, {m.rows}, routeAttrs(moe));
  const int64_t local = moe.experts / job.ep, expertRows = expertRowsOf(job, moe);
  m.expertRows = m.rows;
  m.routing = m.logits;
  if (job.ep > 1) {
    m.counts = declare(name("moe.counts"), {job.ep, local}, plan::DType::Int64);
    emit(OpKind::MoeCounts, {m.logits}, {m.counts}, routeAttrs(moe));
    m.expertRows = name("moe.expert_rows");
    m.routing = exchangeRows(m.rows, m.counts, m.expertRows, expertRows, job.hidden, local);
  }
  auto experts = [&](llvm::StringRef leaf, const std::string &x, int64_t width) {
    std::string y = declare(name("moe." + leaf.str()), {expertRows, width}, job.dtype);
    emit(OpKind::ExpertMatMul, {x, m.routing, expertWeight(block, leaf)}, {y}, routeAttrs(moe));
    return y;
  };
  if (swiglu)
    m.gate = experts("gate", m.expertRows, f);
  m.up = experts("up", m.expertRows, f);
  m.activated = declare(name("moe.act"), {expertRows, f}, job.dtype);
  if (swiglu)
    emit(OpKind::SwiGLU, {m.gate, m.up}, {m.activated});
  else
    emit(OpKind::GELU, {m.up}, {m.activated});
  m.expertOut = experts("down", m.activated, job.hidden);
  m.down = m.expertOut;
  if (job.ep > 1) {
    m.down = name("moe.returned");
    exchangeRows(m.expertOut, m.routing, m.down, rows, job.hidden, local);
  }

  const int64_t shared = moe.sharedFfn() / job.tp;
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
  std::string out = name("moe.out");
  std::string combined = activation(job.tp > 1 ? name("moe.out.partial") : out, job.seq, job.hidden);
  emit(OpKind::MoeCombine, {m.down, m.logits}, {combined}, combineAttrs(moe));
  if (job.tp > 1) {
    activation(out, job.seqRows(), job.hidden);
    if (job.sequenceParallel)
      emit(OpKind::ReduceScatter, {combined}, {out}, groupDimAttrs(plan::Group::TP, 0));
    else
      emit(OpKind::AllReduce, {combined}, {out}, groupAttrs(plan::Group::TP));
  }
  if (!shared)
    return out;
  std::string sharedOut = rowForward(m.sharedActivated, blockName(block, "moe.shared.down"), sfx);
  std::string sum = activation(name("moe.mlp"), job.seqRows(), job.hidden);
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
  // The all-reduce's conjugate is the identity (moe.out.partial shares moe.out's gradient),
  // the reduce-scatter's an all-gather.
  if (job.tp > 1 && job.sequenceParallel) {
    std::string gathered = gradOf(name("moe.out.partial"));
    emit(OpKind::AllGather, {dCombined}, {gathered}, groupDimAttrs(plan::Group::TP, 0));
    dCombined = gathered;
  }
  // The logits' gradient: through the top-k weights (partial over tp), plus the
  // load-balancing loss's, which every tp rank computes whole.
  std::string dLogits = gradOf(name("moe.logits"));
  const Shape logitsShape = {job.seq, job.microBatch, moe.experts};
  std::string dRouted = moe.auxLoss > 0 ? declare(dLogits + ".combine", logitsShape, job.dtype)
                                        : dLogits;
  std::string dPartial = job.tp > 1 ? declare(dRouted + ".partial", logitsShape, job.dtype)
                                    : dRouted;
  const bool exchanged = job.ep > 1;
  std::string dDown = gradOf(name(exchanged ? "moe.returned" : "moe.down"));
  emit(OpKind::MoeCombineBwd, {m.down, m.logits, dCombined}, {dDown, dPartial},
       combineAttrs(moe));
  if (job.tp > 1)
    emit(OpKind::AllReduce, {dPartial}, {dRouted}, groupAttrs(plan::Group::TP));
  if (moe.auxLoss > 0) {
    std::string dAux = declare(dLogits + ".aux", logitsShape, job.dtype);
    emit(OpKind::MoeAuxLossBwd, {m.logits}, {dAux},
         {{"top_k", moe.topK},
          {"aux_loss", moe.auxLoss},
          {"scale", 1.0 / double(job.mapping.microbatches)}});
    emit(OpKind::ResidualAdd, {dRouted, dAux}, {dLogits});
  }

  // The transposes of the two exchanges: the returned rows' gradient goes back to the
  // experts in the blocks the rows came home in, the expert rows' to their tokens.
  const int64_t local = moe.experts / job.ep, expertRows = expertRowsOf(job, moe);
  if (exchanged)
    exchangeRows(dDown, m.counts, plan::gradName(name("moe.down")), expertRows, job.hidden,
                 local);
  auto expertsBackward = [&](llvm::StringRef leaf, const std::string &x, const std::string &dx) {
    std::string weight = expertWeight(block, leaf);
    emit(OpKind::ExpertMatMulBwd, {x, m.routing, weight, plan::gradName(name("moe." + leaf.str()))},
         {dx, plan::gradName(weight)}, routeAttrs(moe));
  };
  std::string dActivated = gradOf(name("moe.act"));
  expertsBackward("down", m.activated, dActivated);
  std::string dExpertRows = gradOf(name(exchanged ? "moe.expert_rows" : "moe.rows"));
  if (swiglu) {
    emit(OpKind::SwiGLUBwd, {m.gate, m.up, dActivated},
         {gradOf(name("moe.gate")), gradOf(name("moe.up"))});
    // gate and up each contribute a part of the rows' gradient.
    const Shape rowsShape = {expertRows, job.hidden};
    for (llvm::StringRef part : {"gate", "up"})
      expertsBackward(part, m.expertRows,
                      declare(dExpertRows + "." + part.str(), rowsShape, job.dtype));
    emit(OpKind::ResidualAdd, {dExpertRows + ".gate", dExpertRows + ".up"}, {dExpertRows});
  } else {
    emit(OpKind::GELUBwd, {m.up, dActivated}, {gradOf(name("moe.up"))});
    expertsBackward("up", m.expertRows, dExpertRows);
  }
  std::string dRows = dExpertRows;
  if (exchanged) {
    dRows = plan::gradName(name("moe.rows"));
    exchangeRows(dExpertRows, m.routing, dRows, job.seq * job.microBatch * moe.topK, job.hidden,
                 local);
  }
  moeInputBackward(block, dims, saved, dRows, dLogits);
}

void ChunkLowerer::moeInputBackward(int64_t block, const BlockDims &dims,
                                    const BlockActivations &saved, const std::string &dRows,
                                    const std::string &dLogits) {
  const MoESpec &moe = dims.moe;
  const MoEActivations &m = saved.moe;
  auto name = [&](llvm::StringRef leaf) { return blockName(block, leaf); };
  const bool swiglu = dims.mlp == MLPKind::SwiGLU;
  // ln2's gradient: the experts' and the shared experts' parts, partial over tp until
  // reduced, then the router's, complete on every tp rank (its sequence part under sequence
  // parallelism).
  std::string dInput = plan::gradName(name("ln2"));
  auto part = [&](llvm::StringRef leaf) {
    return declare(dInput + "." + leaf.str(), {job.seq, job.microBatch, job.hidden}, job.dtype);
  };
  std::vector<std::string> parts = {part("experts")};
  emit(OpKind::MoeDispatchBwd, {dRows, m.logits}, {parts[0]}, routeAttrs(moe));
  std::string mlpInput = regathered(saved.mlpNorm, saved.mlpInput, saved.recomputed);
  std::string router = name("moe.router.weight"), dRouter = part("router");
  emit(OpKind::MatMulBwd, {mlpInput, router, dLogits}, {dRouter, plan::gradName(router)},
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
      columnBackward(mlpInput, prefix, parts.back(), plan::gradName(prefix + ".weight"),
                     job.biases ? plan::gradName(prefix + ".bias") : "");
    }
  }
  std::string sum = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string next = part("sum" + std::to_string(i));
    emit(OpKind::ResidualAdd, {sum, parts[i]}, {next});
    sum = next;
  }
  if (job.tp > 1) {
    std::string reduced = activation(dInput + ".reduced", job.seqRows(), job.hidden);
    if (job.sequenceParallel)
      emit(OpKind::ReduceScatter, {sum}, {reduced}, groupDimAttrs(plan::Group::TP, 0));
    else
      emit(OpKind::AllReduce, {sum}, {reduced}, groupAttrs(plan::Group::TP));
    sum = reduced;
  }
  if (job.sequenceParallel) {
    std::vector<std::string> pieces;
    for (int64_t r = 0; r < job.tp; ++r)
      pieces.push_back(activation(dRouter + ".part" + std::to_string(r), job.seqRows(), job.hidden));
    emit(OpKind::Split, {dRouter}, pieces, {{"dim", int64_t(0)}});
    dRouter = pieces[size_t(tpRank)];
  }
  emit(OpKind::ResidualAdd, {sum, dRouter}, {gradOf(name("ln2"))});
}

} // namespace parc::lower
