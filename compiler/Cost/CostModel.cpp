//===- CostModel.cpp - FLOPs, communication volume and a step-time estimate ===//
//
// Formulas and their sources: docs/memory-and-cost.md.
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/CostModel.h"
#include "parc/Cost/CommModel.h"
#include "parc/Cost/MemoryModel.h"

#include <algorithm>
#include <functional>

namespace parc {

double blockForwardFlopsPerToken(const ModelSpec &model, const LayerGroup &block) {
  const double h = double(model.hidden), d = double(headDim(model, block));
  const double q = double(block.heads) * d, kv = double(block.kvHeads) * d;
  const double f = double(block.ffn);
  const double mlpIn = block.mlp == MLPKind::SwiGLU ? 2 * f : f;
  // Two FLOPs (multiply and add) per weight per token in every linear layer.
  double linear = 2 * (h * (q + 2 * kv) + q * h + h * mlpIn + f * h);
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

/// True when some group of a kind spans nodes; the slowest group sets the pace.
bool anyCrossesNodes(const RankLayout &layout,
                     const std::function<std::vector<int64_t>(int64_t)> &groupOf) {
  for (int64_t rank = 0, n = layout.world(); rank < n; ++rank)
    if (layout.crossesNodes(groupOf(rank)))
      return true;
  return false;
}

struct Traffic {
  double bytes = 0, seconds = 0;
  void allReduce(double buffer, int64_t ranks, const LinkSpec &link, double times = 1) {
    bytes += times * ringBytes(buffer, ranks, true);
    seconds += times * allReduceTime(buffer, ranks, link);
  }
  void allGather(double buffer, int64_t ranks, const LinkSpec &link, double times = 1) {
    bytes += times * ringBytes(buffer, ranks, false);
    seconds += times * allGatherTime(buffer, ranks, link);
  }
  void reduceScatter(double buffer, int64_t ranks, const LinkSpec &link, double times = 1) {
    bytes += times * ringBytes(buffer, ranks, false);
    seconds += times * reduceScatterTime(buffer, ranks, link);
  }
  void send(double buffer, const LinkSpec &link, double times) {
    bytes += times * buffer;
    seconds += times * sendTime(buffer, link);
  }
};

/// What one stage does per microbatch (compute, tp, pp) and per step (dp, embedding sync).
struct StageCost {
  double computeSeconds = 0; // per microbatch
  Traffic tp, pp;            // per microbatch
  Traffic dp, embedding;     // per step
};

} // namespace

CostEstimate estimateCost(const Program &program, const Mapping &mapping) {
  const ModelSpec &model = program.model;
  const ParallelSpec &par = program.parallel;
  const ClusterSpec &cluster = program.cluster;
  const RankLayout &layout = mapping.layout;
  const int64_t tp = mapping.tp, pp = mapping.pp, dp = mapping.dp;
  const double M = double(mapping.microbatches);
  const double tokensPerMicrobatch = double(mapping.microBatch) * double(model.seq);
  const StateBytesPerParam perParam = stateBytesPerParam(program);
  const bool tiedCopy = model.tiedHead() && pp > 1;

  const bool tpInter = anyCrossesNodes(layout, [&](int64_t r) { return layout.tpGroup(r); });
  const bool ppInter = anyCrossesNodes(layout, [&](int64_t r) { return layout.ppGroup(r); });
  const bool dpInter = anyCrossesNodes(layout, [&](int64_t r) { return layout.dpGroup(r); });
  const bool embInter = tiedCopy && anyCrossesNodes(layout, [&](int64_t r) {
                          return layout.embeddingGroup(r, true);
                        });
  auto linkFor = [&](bool inter) -> const LinkSpec & {
    return inter ? cluster.interNode : cluster.intraNode;
  };
  const LinkSpec &tpLink = linkFor(tpInter), &ppLink = linkFor(ppInter);
  const LinkSpec &dpLink = linkFor(dpInter), &embLink = linkFor(embInter);

  CostEstimate est;
  est.tokensPerStep = double(mapping.globalBatch) * double(model.seq);
  est.bubbleFraction = bubbleFraction(mapping, par.schedule);

  // FLOPs of the whole job: backward is twice the forward (Narayanan et al. 2021, eq. 3).
  double blocksForward = 0, recomputed = 0;
  for (int64_t i = 0, n = model.numBlocks(); i < n; ++i) {
    const LayerGroup &block = model.blockGroup(i);
    blocksForward += blockForwardFlopsPerToken(model, block);
    if (par.recompute == Recompute::Full)
      recomputed += blockForwardFlopsPerToken(model, block);
    else if (par.recompute == Recompute::Selective)
      recomputed += attentionCoreFlopsPerToken(model, block);
  }
  const double h = double(model.hidden);
  const double logits = 2 * h * double(model.vocab);
  const double paddedLogits = 2 * h * double(mapping.paddedVocab);
  est.modelFlops = est.tokensPerStep * 3 * (blocksForward + logits);
  est.hardwareFlops = est.tokensPerStep * (3 * (blocksForward + paddedLogits) + recomputed);

  const double actBytes = double(bytesPerElement(model.dtype)) * tokensPerMicrobatch * h;
  const bool sp = par.sequenceParallel && tp > 1;
  // Pipeline messages: with tp > 1 each rank sends its 1/tp slice (sequence parallel, or
  // Megatron's scatter/gather optimisation of Narayanan et al. 2021, section 4.1).
  const double ppMessage = actBytes / double(tp);

  std::vector<StageCost> stages(static_cast<size_t>(pp));
  for (int64_t s = 0; s < pp; ++s) {
    StageCost &c = stages[size_t(s)];
    double forward = 0, extra = 0;
    int64_t blocks = 0;
    double paramsPerRank = 0;
    for (int64_t chunk = 0; chunk < mapping.chunks; ++chunk) {
      auto [first, last] = mapping.partition.range(s, chunk);
      for (int64_t i = first; i < last; ++i) {
        const LayerGroup &block = model.blockGroup(i);
        forward += blockForwardFlopsPerToken(model, block);
        if (par.recompute == Recompute::Full)
          extra += blockForwardFlopsPerToken(model, block);
        else if (par.recompute == Recompute::Selective)
          extra += attentionCoreFlopsPerToken(model, block);
        paramsPerRank += double(blockParams(model, block).perRank(tp));
      }
      blocks += last - first;
    }
    if (s == 0)
      paramsPerRank += double(embeddingParams(model, mapping.paddedVocab).perRank(tp));
    if (s == pp - 1) {
      forward += paddedLogits;
      paramsPerRank += double(finalNormParams(model).perRank(tp));
      if (!model.tiedHead() || pp > 1)
        paramsPerRank += double(headParams(model, mapping.paddedVocab).perRank(tp));
    }
    c.computeSeconds = (3 * forward + extra) * tokensPerMicrobatch / double(tp) / cluster.gpuFlops;

    // Tensor parallel: two collectives per block in the forward (after attention and after
    // the MLP) and two in the backward; full recompute repeats the forward's.
    double perBlock = par.recompute == Recompute::Full ? 6 : 4;
    double collectives = perBlock * double(blocks);
    if (s == 0)
      collectives += 1; // the vocab-parallel embedding's forward reduction
    if (s == pp - 1)
      collectives += 2; // the head: its input in the forward, its input gradient in backward
    if (sp) {
      // Each all-reduce becomes a reduce-scatter plus an all-gather elsewhere in the block.
      c.tp.reduceScatter(actBytes, tp, tpLink, collectives);
      c.tp.allGather(actBytes, tp, tpLink, collectives);
    } else if (s == pp - 1) {
      // Without sequence parallelism the head's forward input is already whole.
      c.tp.allReduce(actBytes, tp, tpLink, collectives - 1);
    } else {
      c.tp.allReduce(actBytes, tp, tpLink, collectives);
    }
    if (s == pp - 1) // vocab-parallel cross entropy: max, target logit and sum of exps
      c.tp.allReduce(4 * tokensPerMicrobatch, tp, tpLink, 3);

    // Pipeline: every virtual stage but the last sends activations forward, every one but the
    // first sends gradients back.
    double sends = 2 * double(mapping.chunks) - (s == pp - 1 ? 1 : 0) - (s == 0 ? 1 : 0);
    if (pp > 1)
      c.pp.send(ppMessage, ppLink, sends);

    // Data parallel, by ZeRO stage (Rajbhandari et al. 2020, section 7): gradients are
    // all-reduced, or reduce-scattered with the updated weights all-gathered back; sharded
    // gradients (ZeRO-2) leave every microbatch, sharded weights (ZeRO-3) are gathered for
    // every forward and backward.
    const double grads = paramsPerRank * perParam.grad;
    const double weights = paramsPerRank * perParam.weight;
    switch (par.zero) {
    case 0:
      c.dp.allReduce(grads, dp, dpLink);
      break;
    case 1:
      c.dp.reduceScatter(grads, dp, dpLink);
      c.dp.allGather(weights, dp, dpLink);
      break;
    case 2:
      c.dp.reduceScatter(grads, dp, dpLink, M);
      c.dp.allGather(weights, dp, dpLink);
      break;
    default:
      c.dp.reduceScatter(grads, dp, dpLink, M);
      c.dp.allGather(weights, dp, dpLink, 2 * M);
      break;
    }
    if (tiedCopy && (s == 0 || s == pp - 1)) {
      double embGrads = double(headParams(model, mapping.paddedVocab).perRank(tp)) * perParam.grad;
      c.embedding.allReduce(embGrads, 2, embLink);
    }
  }

  // The slowest stage paces the pipeline: M microbatches plus the bubble.
  auto perMicrobatch = [](const StageCost &c) {
    return c.computeSeconds + c.tp.seconds + c.pp.seconds;
  };
  const StageCost &critical =
      *std::max_element(stages.begin(), stages.end(), [&](const StageCost &a, const StageCost &b) {
        return perMicrobatch(a) < perMicrobatch(b);
      });
  const double pipelineScale = M * (1 + est.bubbleFraction);
  est.computeSeconds = pipelineScale * critical.computeSeconds;

  auto row = [&](const char *kind, const std::string &ops, int64_t ranks, int64_t groups,
                 bool inter, double bytes, double seconds) {
    GroupTraffic g;
    g.kind = kind;
    g.operations = ops;
    g.ranks = ranks;
    g.groups = groups;
    g.interNode = inter;
    g.bytesPerRank = bytes;
    g.seconds = seconds;
    est.traffic.push_back(g);
  };
  auto maxOver = [&](const std::function<double(const StageCost &)> &f) {
    double best = 0;
    for (const StageCost &c : stages)
      best = std::max(best, f(c));
    return best;
  };
  const int64_t world = layout.world();
  std::string tpOps = std::string(sp ? "all-gather + reduce-scatter" : "all-reduce") + ", " +
                      (par.recompute == Recompute::Full ? "6" : "4") + " per block per microbatch";
  row("tp", tpOps, tp, world / tp, tpInter,
      M * maxOver([](const StageCost &c) { return c.tp.bytes; }),
      pipelineScale * critical.tp.seconds);
  row("pp", "activations forward, gradients backward, per microbatch", pp, world / pp, ppInter,
      M * maxOver([](const StageCost &c) { return c.pp.bytes; }),
      pipelineScale * critical.pp.seconds);
  const char *dpOps = par.zero == 0   ? "gradient all-reduce"
                      : par.zero <= 2 ? "gradient reduce-scatter + weight all-gather"
                                      : "gradient reduce-scatter + weight all-gathers";
  row("dp", dpOps, dp, world / dp, dpInter, maxOver([](const StageCost &c) { return c.dp.bytes; }),
      maxOver([](const StageCost &c) { return c.dp.seconds; }));
  if (tiedCopy)
    row("embedding", "tied embedding gradient all-reduce", 2, tp * dp, embInter,
        maxOver([](const StageCost &c) { return c.embedding.bytes; }),
        maxOver([](const StageCost &c) { return c.embedding.seconds; }));

  est.stepSeconds = est.computeSeconds;
  for (const GroupTraffic &g : est.traffic)
    est.stepSeconds += g.seconds;
  est.mfu = est.modelFlops / (est.stepSeconds * double(world) * cluster.gpuFlops);
  return est;
}

} // namespace parc
