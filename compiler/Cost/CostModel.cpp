//===- CostModel.cpp - FLOPs, communication volume and a step-time estimate ===//
//
// Formulas and their sources: docs/memory-and-cost.md.
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/CostModel.h"
#include "parc/Cost/MemoryModel.h"

#include <algorithm>

namespace parc {

double mlpWeightsPerToken(const ModelSpec &model, const LayerGroup &block) {
  const double h = double(model.hidden);
  auto mlp = [&](double f) { return h * (isGated(block.mlp) ? 2 * f : f) + f * h; };
  const MoESpec &moe = block.moe;
  if (!moe.enabled())
    return mlp(double(block.ffn));
  // The router, top_k experts and the shared experts.
  return h * double(moe.experts) + double(moe.topK) * mlp(double(moe.ffn)) +
         mlp(double(moe.sharedFfn()));
}

double blockForwardFlopsPerToken(const ModelSpec &model, const LayerGroup &block) {
  const double h = double(model.hidden), d = double(headDim(model, block));
  const double q = double(block.heads) * d, kv = double(block.kvHeads) * d;
  // Two FLOPs (multiply and add) per weight per token in every linear layer.
  double linear = 2 * (h * (q + 2 * kv) + q * h + mlpWeightsPerToken(model, block));
  return linear + attentionCoreFlopsPerToken(model, block);
}

double attentionCoreFlopsPerToken(const ModelSpec &model, const LayerGroup &block) {
  // QK^T and scores x V: each token meets all `seq` keys in every head, as Narayanan et al.
  // count it (no causal-mask discount).
  const double q = double(block.heads) * double(headDim(model, block));
  return 2 * 2 * double(model.seq) * q;
}

namespace {

/// Bytes one rank sends in a ring collective whose full buffer is `bytes` (Thakur et al.).
double ringBytes(double bytes, int64_t ranks, bool allReduce) {
  if (ranks <= 1)
    return 0;
  double perPhase = double(ranks - 1) / double(ranks) * bytes;
  return allReduce ? 2 * perPhase : perPhase;
}

/// Bytes one rank of stage `s` sends per step in each group kind.
struct StageBytes {
  double tp = 0, pp = 0, dp = 0, cp = 0, embedding = 0, ep = 0;
};

/// Keys and values one rank sends per block and microbatch in ring attention: cp - 1 hops
/// forward, cp - 1 again in the backward with cp of the accumulated dK/dV, and the forward's
/// again where recomputation repeats attention.
double ringAttentionBytes(const Program &program, const Mapping &mapping, int64_t s) {
  const ModelSpec &model = program.model;
  if (mapping.cp == 1)
    return 0;
  const double cp = double(mapping.cp), e = double(bytesPerElement(model.dtype));
  const double hops = 3 * (cp - 1) + 1 + (program.parallel.recompute == Recompute::None ? 0 : cp - 1);
  double bytes = 0;
  for (int64_t chunk = 0; chunk < mapping.chunks; ++chunk) {
    auto [first, last] = mapping.partition.range(s, chunk);
    for (int64_t i = first; i < last; ++i) {
      const LayerGroup &block = model.blockGroup(i);
      double d = double(headDim(model, block));
      double kv = block.kvHeads >= mapping.tp ? double(block.kvHeads) * d / double(mapping.tp) : d;
      bytes += hops * 2 * e * double(mapping.microBatch) * double(model.seq) / cp * kv;
    }
  }
  return bytes;
}

StageBytes stageBytes(const Program &program, const Mapping &mapping, const WorkTable &work,
                      int64_t s) {
  const ModelSpec &model = program.model;
  const ParallelSpec &par = program.parallel;
  const int64_t tp = mapping.tp, pp = mapping.pp, dp = mapping.gradientRanks();
  const double M = double(mapping.microbatches);
  const double tokens = double(mapping.microBatch) * double(model.seq) / double(mapping.cp);
  const double act = double(bytesPerElement(model.dtype)) * tokens * double(model.hidden);
  const bool sp = par.sequenceParallel && tp > 1;
  StageBytes b;

  // Two reductions per block forward and two backward; full recompute repeats the forward's.
  double collectives = (par.recompute == Recompute::Full ? 6 : 4) *
                       double(mapping.partition.blocksOnStage(s));
  if (s == 0)
    collectives += 1; // the vocab-parallel embedding's forward reduction
  if (s == pp - 1)
    collectives += sp ? 2 : 1; // the head's input: gathered forward (sp), reduced backward
  b.tp = M * collectives * (sp ? 2 * ringBytes(act, tp, false) : ringBytes(act, tp, true));
  if (s == pp - 1) // vocab-parallel cross entropy: max, target logit and sum of exps
    b.tp += M * 3 * ringBytes(4 * tokens, tp, true);

  if (pp > 1) {
    double sends = 2 * double(mapping.chunks) - (s == pp - 1 ? 1 : 0) - (s == 0 ? 1 : 0);
    b.pp = M * sends * work.messageBytes;
  }
  const int zero = dp > 1 ? par.zero : 0;
  const double params = work.stages[size_t(s)].params;
  const double grads = params * double(bytesPerElement(program.train.gradDtype));
  const double weights = params * double(bytesPerElement(model.dtype));
  switch (zero) {
  case 0:
    b.dp = ringBytes(grads, dp, true);
    break;
  case 1:
    b.dp = ringBytes(grads, dp, false) + ringBytes(weights, dp, false);
    break;
  case 2:
    b.dp = M * ringBytes(grads, dp, false) + ringBytes(weights, dp, false);
    break;
  default:
    b.dp = M * (ringBytes(grads, dp, false) + 2 * ringBytes(weights, dp, false));
    break;
  }
  b.cp = M * ringAttentionBytes(program, mapping, s);
  // Per MoE block and microbatch: dispatch and combine forward, their transposes backward.
  for (int64_t chunk = 0; chunk < mapping.chunks; ++chunk) {
    auto [first, last] = mapping.partition.range(s, chunk);
    for (int64_t i = first; i < last; ++i)
      if (const MoESpec &moe = model.blockGroup(i).moe; moe.enabled() && mapping.ep > 1)
        b.ep += M * 4 * double(mapping.ep - 1) / double(mapping.ep) *
                expertRows(moe, tokens, mapping.ep).expected * act / tokens;
  }
  if (model.tiedHead() && pp > 1 && (s == 0 || s == pp - 1))
    b.embedding = ringBytes(
        double(headParams(model, mapping.paddedVocab).perRank(tp)) *
            double(bytesPerElement(program.train.gradDtype)),
        2, true);
  return b;
}

/// The parts of the critical stage's time: its passes summed over the microbatches, the idle
/// rest of its pipeline, and its tail.
StepBreakdown breakdownOf(const WorkTable &work, const StepTimeline &timeline, int64_t stage,
                          double microbatches) {
  StepBreakdown b;
  double busy = 0, zero = 0;
  for (const VirtualStageWork *w : work.chunksOf(stage)) {
    b.compute += microbatches * (w->forward.compute() + w->backward.compute());
    b.recompute += microbatches * w->recompute.compute();
    b.tp += microbatches * (w->forward.tp + w->backward.tp + w->recompute.tp);
    b.cp += microbatches * (w->forward.cp + w->backward.cp + w->recompute.cp);
    b.ep += microbatches * (w->forward.ep + w->backward.ep + w->recompute.ep);
    zero += microbatches * (w->forward.zero + w->backward.zero + w->recompute.zero);
    busy += microbatches * (w->forwardSeconds() + w->backwardSeconds());
  }
  const StageTail &tail = timeline.tails[size_t(stage)];
  // Summing thousands of passes leaves rounding noise where the pipeline has no idle time.
  double idle = tail.pipelineEnd - busy;
  idle = idle > 1e-9 * tail.pipelineEnd ? idle : 0;
  b.pp = std::min(idle, std::max(0.0, timeline.pipelineMakespan -
                                          timeline.pipelineWithoutTransfers));
  b.bubble = idle - b.pp;
  b.dp = zero + (tail.gradSyncEnd - tail.pipelineEnd) +
         (tail.embeddingSyncEnd - tail.embeddingSyncStart) +
         (tail.paramGatherEnd - tail.paramGatherStart);
  b.optimizer = tail.optimizerEnd - tail.optimizerStart;
  return b;
}

} // namespace

CostEstimate estimateCost(const Program &program, const Mapping &mapping,
                          const WorkTable &work, const StepTimeline &timeline) {
  const ModelSpec &model = program.model;
  const ParallelSpec &par = program.parallel;
  const RankLayout &layout = mapping.layout;
  const int64_t tp = mapping.tp, pp = mapping.pp, dp = mapping.gradientRanks();
  const int64_t world = layout.world();
  const double M = double(mapping.microbatches);

  CostEstimate est;
  est.tokensPerStep = double(mapping.globalBatch) * double(model.seq);
  est.bubbleFraction = bubbleFraction(mapping, par.schedule);
  // FLOPs of the whole job: every stage's per-rank FLOPs over its tp x dp x cp ranks.
  for (const VirtualStageWork &w : work.virtualStages) {
    est.modelFlops += M * w.modelFlops * double(tp * dp);
    est.hardwareFlops += M * w.hardwareFlops * double(tp * dp);
  }

  est.criticalStage = timeline.criticalStage();
  est.breakdown = breakdownOf(work, timeline, est.criticalStage, M);
  est.stepSeconds = timeline.makespan;
  const double peak = double(world) * program.cluster.gpuFlops;
  if (est.stepSeconds > 0) {
    est.mfu = est.modelFlops / (est.stepSeconds * peak);
    est.hfu = est.hardwareFlops / (est.stepSeconds * peak);
    est.tokensPerSecond = est.tokensPerStep / est.stepSeconds;
    if (program.train.tokens > 0)
      est.trainSeconds = program.train.tokens / est.tokensPerSecond;
  }

  std::vector<StageBytes> bytes;
  for (int64_t s = 0; s < pp; ++s)
    bytes.push_back(stageBytes(program, mapping, work, s));
  auto maxOver = [&](double StageBytes::*field) {
    double best = 0;
    for (const StageBytes &b : bytes)
      best = std::max(best, b.*field);
    return best;
  };
  auto row = [&](const char *kind, std::string ops, int64_t ranks, bool inter, double sent,
                 double seconds) {
    est.traffic.push_back({kind, std::move(ops), ranks, world / ranks, inter, sent, seconds});
  };
  const bool sp = par.sequenceParallel && tp > 1;
  std::string tpOps = std::string(sp ? "all-gather + reduce-scatter" : "all-reduce") + ", " +
                      (par.recompute == Recompute::Full ? "6" : "4") + " per block per microbatch";
  row("tp", tpOps, tp, work.tp.crossesNodes(), maxOver(&StageBytes::tp), est.breakdown.tp);
  row("pp", "activations forward, gradients backward, per microbatch", pp,
      work.pp.crossesNodes(), maxOver(&StageBytes::pp), est.breakdown.pp);
  const char *dpOps = par.zero == 0   ? "gradient all-reduce"
                      : par.zero <= 2 ? "gradient reduce-scatter + weight all-gather"
                                      : "gradient reduce-scatter + weight all-gathers";
  const StageTail &tail = timeline.tails[size_t(est.criticalStage)];
  double embeddingSeconds = tail.embeddingSyncEnd - tail.embeddingSyncStart;
  row(mapping.cp > 1 ? "dp_cp" : "dp", dpOps, dp, work.dp.crossesNodes(),
      maxOver(&StageBytes::dp), est.breakdown.dp - embeddingSeconds);
  if (mapping.cp > 1)
    row("cp", "ring attention: keys and values around the ring, dK/dV back, per block per "
              "microbatch",
        mapping.cp, work.cp.crossesNodes(), maxOver(&StageBytes::cp), est.breakdown.cp);
  if (model.tiedHead() && pp > 1)
    row("embedding", "tied embedding gradient all-reduce", 2, work.pp.crossesNodes(),
        maxOver(&StageBytes::embedding), embeddingSeconds);
  if (model.hasExperts())
    row("ep", "token all-to-all, 4 per MoE block per microbatch", mapping.ep,
        work.ep.crossesNodes(), maxOver(&StageBytes::ep), est.breakdown.ep);
  return est;
}

CostEstimate estimateCost(const Program &program, const Mapping &mapping) {
  WorkTable work = buildWorkTable(program, mapping);
  llvm::Expected<StepTimeline> timeline = simulateStep(program, mapping, work, false);
  if (!timeline) {
    llvm::consumeError(timeline.takeError());
    return {};
  }
  return estimateCost(program, mapping, work, *timeline);
}

} // namespace parc
