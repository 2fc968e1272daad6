//===- Feasibility.cpp - The mapping rules as predicates ------------------===//
#include "parc/Check/Feasibility.h"
#include "parc/Support/CheckedInt.h"

namespace parc {

unsigned tensorSplitFailures(int64_t heads, int64_t kvHeads, int64_t ffn, int64_t tp) {
  unsigned failures = 0;
  if (heads % tp != 0)
    failures |= SplitsHeads;
  if (kvHeads != heads && kvHeads % tp != 0 && tp % kvHeads != 0)
    failures |= SplitsKvHeads;
  if (ffn % tp != 0)
    failures |= SplitsFfn;
  return failures;
}

namespace {
bool splits(int64_t heads, int64_t kvHeads, int64_t ffn, int64_t tp) {
  return tensorSplitFailures(heads, kvHeads, ffn, tp) == 0;
}
} // namespace

bool tensorParallelSplits(const ModelSpec &model, int64_t tp) {
  if (tp < 1 || !splits(model.heads, model.kvHeads, model.ffn, tp))
    return false;
  for (const LayerGroup &g : model.layers)
    if (g.kind == LayerGroup::Transformer &&
        (!splits(g.heads, g.kvHeads, g.ffn, tp) ||
         (g.moe.enabled() &&
          (expertSplitFailures(g.moe, 1, tp) & (SplitsExpertFfn | SplitsSharedFfn)))))
      return false;
  return true;
}

unsigned expertSplitFailures(const MoESpec &moe, int64_t ep, int64_t tp) {
  unsigned failures = 0;
  if (moe.topK > moe.experts)
    failures |= RoutesTooMany;
  if (moe.experts % ep != 0)
    failures |= SplitsExperts;
  if (moe.ffn % tp != 0)
    failures |= SplitsExpertFfn;
  if (moe.sharedFfn() % tp != 0)
    failures |= SplitsSharedFfn;
  return failures;
}

bool expertParallelSplits(const ModelSpec &model, int64_t ep, int64_t carved) {
  if (ep < 1 || carved % ep != 0 || (ep > 1 && !model.hasExperts()))
    return false;
  for (const LayerGroup &g : model.layers)
    if (g.kind == LayerGroup::Transformer && g.moe.enabled() &&
        (expertSplitFailures(g.moe, ep, 1) & (RoutesTooMany | SplitsExperts)))
      return false;
  return true;
}

bool sequenceParallelSplits(const ModelSpec &model, int64_t tp, int64_t cp) {
  return tp > 1 && cp >= 1 && model.seq % cp == 0 && model.seq / cp % tp == 0;
}

bool contextParallelSplits(const ModelSpec &model, int64_t cp) {
  std::optional<int64_t> chunks = checkedMul(2, cp);
  return cp == 1 || (chunks && model.seq % *chunks == 0);
}

bool orderNamesAxes(const RankOrder &order, const AxisSizes &sizes) {
  for (Axis a : kAllAxes)
    if (sizes[indexOf(a)] > 1 && !order.names(a))
      return false;
  return true;
}

std::optional<StagePartition> partitionBlocks(int64_t blocks, int64_t pp, int64_t chunks,
                                              const std::vector<int64_t> &stageLayers,
                                              PartitionFailure *why) {
  auto fail = [&](PartitionFailure failure) -> std::optional<StagePartition> {
    if (why)
      *why = failure;
    return std::nullopt;
  };
  std::optional<int64_t> stages = checkedMul(pp, chunks);
  if (!stages || *stages < 1)
    return fail(stageLayers.empty() ? PartitionFailure::Uneven : PartitionFailure::StageCount);
  StagePartition partition;
  partition.pp = pp;
  partition.chunks = chunks;
  if (stageLayers.empty()) {
    if (blocks % *stages != 0)
      return fail(PartitionFailure::Uneven);
    for (int64_t v = 0, first = 0; v < *stages; ++v, first += blocks / *stages)
      partition.blocks.push_back({first, first + blocks / *stages});
    return partition;
  }
  if (int64_t(stageLayers.size()) != *stages)
    return fail(PartitionFailure::StageCount);
  int64_t sum = 0;
  for (int64_t n : stageLayers) {
    partition.blocks.push_back({sum, sum + n});
    sum += n;
  }
  if (sum != blocks)
    return fail(PartitionFailure::BlockSum);
  return partition;
}

std::optional<int64_t> paddedVocab(int64_t vocab, int64_t tp) {
  std::optional<int64_t> multiple = checkedMul(128, tp);
  return multiple ? roundUpToMultiple(vocab, *multiple) : std::nullopt;
}

Mapping makeMapping(const Program &program, int64_t dp, StagePartition partition,
                    int64_t padded) {
  const ParallelSpec &par = program.parallel;
  Mapping m;
  m.tp = par.tp;
  m.pp = par.pp;
  m.dp = dp;
  m.cp = par.cp;
  m.chunks = par.schedule == ScheduleKind::Interleaved ? par.chunks : 1;
  m.microBatch = par.microBatch;
  m.globalBatch = par.globalBatch;
  m.microbatches = par.globalBatch / (par.microBatch * dp);
  m.paddedVocab = padded;
  m.ep = par.ep;
  m.layout =
      RankLayout(par.tp, par.pp, dp, par.order, program.cluster.gpusPerNode, par.cp, par.ep);
  m.partition = std::move(partition);
  return m;
}

} // namespace parc
