//===- AxisRules.cpp - Rules of context and expert parallelism and of placement ---===//
//
// The rules of MappingChecker (MappingChecker.h) past the tp x pp x dp grid: ring attention's
// chunks, the expert grid carved from dp x cp, tensor- and context-parallel groups that span
// nodes, and the pipeline bubble.
//
//===----------------------------------------------------------------------===//
#include "MappingChecker.h"

#include "parc/Cost/CommModel.h"
#include "parc/Support/Units.h"

#include "llvm/Support/Format.h"

#include <algorithm>

namespace parc::rules {

namespace {
/// "12.5%"
std::string percent(double fraction) {
  std::string out;
  llvm::raw_string_ostream(out) << llvm::format("%.1f%%", fraction * 100);
  return out;
}
} // namespace

/// Ring attention needs the sequence in 2 x cp equal chunks, and Megatron-Core's layout an
/// order that places cp.
void MappingChecker::checkContext() {
  if (par.cp == 1)
    return;
  if (!contextParallelSplits(model, par.cp)) {
    error("parallel.cp", "cp = " + str(par.cp) + " cuts the sequence into 2 x cp = " +
                             str(2 * par.cp) + " chunks (rank r holds chunks r and 2cp-1-r, which "
                             "balances the causal mask), but seq = " + str(model.seq) +
                             " is not a multiple of " + str(2 * par.cp) + "; use cp = " +
                             divisorsUpTo(model.seq / 2, std::max<int64_t>(par.cp, 8)));
    noteField("model.seq", model.seq);
  }
  if (!par.order.names(Axis::CP))
    error("parallel.order",
          "the order leaves out cp, but cp = " + str(par.cp) + ": name every axis larger than 1, "
          "as Megatron-Core's RankGenerator requires (for example order = tp-cp-dp-pp)");
}

/// Every ring step sends a rank's keys and values to the next rank of its cp group while the
/// attention of the block it holds runs; across nodes the send may take longer than even a
/// perfectly efficient attention step, and then the ring stalls the layer.
void MappingChecker::warnContextAcrossNodes() {
  if (par.cp == 1 || !mapping.layout.anyGroupCrossesNodes(Axis::CP) || !cluster.hasInterNode)
    return;
  const LayerGroup &block = firstTransformer();
  double tp = double(par.tp), d = double(model.hidden / block.heads);
  double heads = double(block.heads) / tp;
  double kvHeads = std::max(1.0, double(block.kvHeads) / tp);
  double local = double(model.seq) / double(par.cp), b = double(par.microBatch);
  double bytes = 2 * local * b * kvHeads * d * double(bytesPerElement(model.dtype));
  // A ring step covers half of the local queries against the received keys: local^2 / 2
  // query-key pairs, 4 d FLOPs each (QK^T and PV).
  double stepFlops = 4 * d * b * heads * local * local / 2;
  double compute = cluster.gpuFlops > 0 ? stepFlops / cluster.gpuFlops : 0;
  CommModel comm(cluster);
  double inter = comm.send(bytes, true), intra = comm.send(bytes, false);
  if (inter <= compute)
    return;
  diags.warning(at(written("parallel.order") ? "parallel.order" : "parallel.cp"),
                "context-parallel groups span nodes: each ring step sends " + formatBytes(bytes) +
                    " of keys and values over the inter-node link in about " +
                    formatQuantity(inter, Dimension::time()) + " (" +
                    formatQuantity(intra, Dimension::time()) +
                    " inside a node), longer than the " +
                    formatQuantity(compute, Dimension::time()) +
                    " of attention it overlaps even at the GPU's peak; keep cp groups inside a "
                    "node (cp x tp dividing gpus_per_node = " +
                    str(cluster.gpusPerNode) +
                    ", cp next to tp in 'order') or lower cp: a step's attention grows with "
                    "(seq / cp)^2, its keys and values only with seq / cp");
  noteField("cluster.gpus_per_node", cluster.gpusPerNode);
}

/// Expert parallelism splits every MoE block's experts over ep ranks carved from the dp x cp
/// ranks, each expert split over tp like a dense MLP (Megatron-Core's expert rank generator,
/// megatron/core/parallel_state.py: expert tp = tp, expert dp = world / (tp x ep x pp)).
void MappingChecker::checkExperts() {
  mapping.ep = par.ep;
  for (const LayerGroup &g : model.layers)
    if (g.kind == LayerGroup::Transformer && g.moe.enabled())
      checkExpertLayer(g);
  if (par.ep == 1)
    return;
  if (!model.hasExperts()) {
    error("parallel.ep", "ep = " + str(par.ep) + " splits experts over ranks, but model '" +
                             model.name + "' has no mixture-of-experts block; set ep = 1 or "
                             "give a transformer layer experts");
    return;
  }
  int64_t carved = mapping.dp * par.cp;
  if (dpKnown && carved % par.ep != 0) {
    error("parallel.ep", "ep = " + str(par.ep) + " does not divide dp x cp = " + str(carved) +
                             ": expert-parallel groups are carved from the data- and "
                             "context-parallel ranks; use ep = " +
                             divisorsUpTo(carved, carved));
    noteField("parallel.dp", mapping.dp);
  }
}

void MappingChecker::checkExpertLayer(const LayerGroup &g) {
  const MoESpec &moe = g.moe;
  auto layerError = [&](const std::string &message) {
    diags.error(g.range, "layer '" + g.name + "' " + message);
    failed = true;
  };
  const unsigned failures = expertSplitFailures(moe, par.ep, par.tp);
  if (failures & RoutesTooMany)
    layerError("routes each token to top_k = " + str(moe.topK) + " of its " + str(moe.experts) +
               " experts; use top_k <= experts");
  if (failures & SplitsExperts) {
    layerError("has " + str(moe.experts) + " experts, which ep = " + str(par.ep) +
               " does not split: every expert-parallel rank holds the same number of whole "
               "experts; use ep = " +
               divisorsUpTo(moe.experts, moe.experts));
    noteField("parallel.ep", par.ep);
  }
  if (failures & SplitsExpertFfn)
    layerError("has moe_ffn = " + str(moe.ffn) + ", which tp = " + str(par.tp) +
               " does not split: each expert's columns split evenly over tensor-parallel "
               "ranks; use tp = " +
               divisorsUpTo(moe.ffn, std::max(par.tp, cluster.gpusPerNode)));
  else if (failures & SplitsSharedFfn)
    layerError("has shared experts of " + str(moe.sharedFfn()) + " columns, which tp = " +
               str(par.tp) + " does not split evenly");
}

/// Megatron-Core asserts that its expert grid (same order, cp = 1, ep x expert dp = dp x cp)
/// keeps the pipeline groups; parc also keeps the tensor groups, which split each expert.
/// Whatever ep, the expert grid folds cp into the expert dp, so a model with experts needs it.
void MappingChecker::checkExpertGrid() {
  if (!model.hasExperts() || mapping.layout.expertGridAligned())
    return;
  error("parallel.order", "order " + mapping.layout.orderText() +
                              " puts tp or pp between cp and dp, so expert-parallel groups "
                              "carved from dp x cp would change the tensor or pipeline groups; "
                              "keep cp and dp adjacent (for example order = tp-cp-ep-dp-pp)");
  noteField("parallel.cp", par.cp);
}

/// Megatron's tensor parallelism all-reduces each layer's activations twice in the forward
/// (after attention and after the MLP) and twice in the backward; sequence parallelism turns
/// each into an all-gather and a reduce-scatter of the same ring cost.
void MappingChecker::warnTensorAcrossNodes() {
  if (!mapping.layout.anyGroupCrossesNodes(Axis::TP))
    return;
  double bytes = double(par.microBatch) * double(model.seq / par.cp) * double(model.hidden) *
                 double(bytesPerElement(model.dtype));
  CommModel comm(cluster);
  GroupGeometry spanning = geometryOf(mapping.layout, Axis::TP), inside;
  inside.ranks = inside.ranksPerNode = par.tp;
  double inter = 4 * comm.allReduce(bytes, spanning);
  double intra = 4 * comm.allReduce(bytes, inside);
  bool tooWide = par.tp > cluster.gpusPerNode;
  diags.warning(
      at(tooWide || !written("parallel.order") ? "parallel.tp" : "parallel.order"),
      "tensor-parallel groups span nodes: one layer's 4 all-reduces of " + formatBytes(bytes) +
          " would take about " + formatQuantity(inter, Dimension::time()) +
          " over the inter-node link instead of " + formatQuantity(intra, Dimension::time()) +
          " inside a node; use a tp that divides gpus_per_node = " + str(cluster.gpusPerNode) +
          " and put tp first in 'order'");
  noteField("cluster.gpus_per_node", cluster.gpusPerNode);
}

void MappingChecker::warnBubble() {
  if (!batchKnown || par.pp < 2)
    return;
  int64_t m = mapping.microbatches;
  double bubble = bubbleFraction(mapping, par.schedule);
  std::string where = "parallel.global_batch";
  if (par.schedule != ScheduleKind::Interleaved && m < par.pp) {
    diags.warning(at(where), "only M = " + str(m) + " microbatches for pp = " + str(par.pp) +
                                 " pipeline stages: each stage idles for over half of the "
                                 "step (bubble (pp - 1) / M = " +
                                 percent(bubble) +
                                 " of the compute time); raise global_batch or lower "
                                 "micro_batch so that M >= pp");
    noteField("parallel.pp", par.pp);
    return;
  }
  if (bubble <= 0.25)
    return;
  std::string formula = par.schedule == ScheduleKind::Interleaved
                            ? "(pp - 1) / (chunks x M) = " + str(par.pp - 1) + " / (" +
                                  str(mapping.chunks) + " x " + str(m) + ")"
                            : "(pp - 1) / M = " + str(par.pp - 1) + " / " + str(m);
  diags.warning(at(where), "the pipeline bubble " + formula + " is " + percent(bubble) +
                               " of the compute time; raise global_batch so that M >= " +
                               str(4 * (par.pp - 1)) + ", or lower micro_batch" +
                               (par.schedule == ScheduleKind::Interleaved
                                    ? ""
                                    : ", or use schedule = interleaved(chunks = 2)"));
  noteField("parallel.pp", par.pp);
}

} // namespace parc::rules
