//===- Rules.cpp - The feasibility rules of a parallel mapping ------------===//
//
// Every rule that makes a tp x pp x dp mapping impossible (or pointless) for a model on a
// cluster (those of context and expert parallelism and of placement in AxisRules.cpp). All
// of them run on every input, so one run reports every violation; the mapping is
// only returned when none failed. Each error sits on the field to change and says how, with a
// note on the field it conflicts with.
//
//===----------------------------------------------------------------------===//
#include "MappingChecker.h"

#include "parc/Cost/ZeroPolicy.h"
#include "parc/Support/CheckedInt.h"
#include "parc/Support/Limits.h"

#include <algorithm>

namespace parc::rules {

// Divisors come in pairs d, n / d with d <= sqrt(n), so finding them takes O(sqrt n) steps.
std::string divisorsUpTo(int64_t n, int64_t limit) {
  std::vector<int64_t> found;
  for (int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0)
      continue;
    for (int64_t divisor : {d, n / d})
      if (divisor <= limit && (found.empty() || found.back() != divisor))
        found.push_back(divisor);
  }
  std::sort(found.begin(), found.end());
  std::string out;
  for (size_t i = 0; i < found.size(); ++i)
    out += (i == 0 ? "" : i + 1 == found.size() ? " or " : ", ") + str(found[i]);
  return out;
}

namespace {
/// "96 or 104": the multiples of `step` around `value` (only the upper one when value < step).
std::string nearestMultiples(int64_t value, int64_t step) {
  int64_t below = value / step * step;
  std::optional<int64_t> above = checkedAdd(below, step);
  std::string up = above ? str(*above) : "a larger multiple";
  return below > 0 ? str(below) + " or " + up : up;
}
} // namespace

const LayerGroup &MappingChecker::firstTransformer() const {
  for (const LayerGroup &g : model.layers)
    if (g.kind == LayerGroup::Transformer)
      return g;
  return model.layers.front();
}

void MappingChecker::checkWorld() {
  std::optional<int64_t> gpus = checkedMul(cluster.nodes, cluster.gpusPerNode);
  if (!gpus) {
    error("cluster.nodes", "nodes x gpus_per_node overflows a 64-bit count; use fewer nodes");
    return;
  }
  int64_t world = *gpus;
  std::string clusterText = "cluster '" + cluster.name +
                            "' has nodes x gpus_per_node = " + str(cluster.nodes) + " x " +
                            str(cluster.gpusPerNode) + " = " + str(world) + " GPUs";
  // Without context parallelism the messages name tp x pp only, as before cp existed.
  bool withCp = par.cp > 1;
  std::string others = withCp ? "tp x cp x pp" : "tp x pp";
  std::string othersValue = withCp ? str(par.tp) + " x " + str(par.cp) + " x " + str(par.pp)
                                   : str(par.tp) + " x " + str(par.pp);
  std::optional<int64_t> tpp = checkedMul(par.tp, par.pp);
  if (tpp)
    tpp = checkedMul(*tpp, par.cp);
  if (par.dpAuto) {
    if (!tpp || world % *tpp != 0) {
      error("parallel.dp", "cannot derive dp: " + others + " = " + othersValue +
                               " does not divide the " + str(world) +
                               " GPUs of the cluster; choose " +
                               (withCp ? "tp, cp and pp" : "tp and pp") +
                               " whose product divides " + str(world));
      diags.note(at("cluster.nodes"), clusterText);
      return;
    }
    mapping.dp = world / *tpp;
  } else {
    std::optional<int64_t> ranks = tpp ? checkedMul(*tpp, par.dp) : std::nullopt;
    if (!ranks || *ranks != world) {
      std::string fix = tpp && world % *tpp == 0
                            ? "set dp = " + str(world / *tpp) + " (or dp = auto)"
                            : "choose " + std::string(withCp ? "tp, cp and pp" : "tp and pp") +
                                  " whose product divides " + str(world) + ", then dp = " +
                                  str(world) + " / (" + others + ")";
      error("parallel.dp", others + " x dp = " + othersValue + " x " + str(par.dp) +
                               " does not match the " + str(world) +
                               " GPUs of the cluster; " + fix);
      diags.note(at("cluster.nodes"), clusterText);
      return;
    }
    mapping.dp = par.dp;
  }
  // Here tp x cp x pp x dp is the cluster's world, computed without overflow above.
  int64_t ranks = world;
  if (ranks > limits::MaxWorld) {
    error(par.dpAuto ? "cluster.nodes" : "parallel.dp",
          "the job has " + others + " x dp = " + othersValue + " x " + str(mapping.dp) + " = " +
              str(ranks) + " ranks, more than the limit of " + str(limits::MaxWorld));
    return;
  }
  dpKnown = true;
}

void MappingChecker::checkModelShape() {
  // A written head_dim sets the width of every head; only hidden / heads must divide.
  bool headsSplitHidden = model.headDim == 0;
  if (headsSplitHidden && model.hidden % model.heads != 0) {
    diags.error(at("model.hidden"), "hidden = " + str(model.hidden) +
                                        " is not a multiple of heads = " + str(model.heads) +
                                        ": every attention head needs the same width hidden / "
                                        "heads; change hidden or heads, or write head_dim");
    noteField("model.heads", model.heads);
    failed = true;
  }
  if (model.kvHeads != model.heads && model.heads % model.kvHeads != 0) {
    error("model.kv_heads", "kv_heads = " + str(model.kvHeads) +
                                " does not divide heads = " + str(model.heads) +
                                ": grouped-query attention shares each "
                                "key/value head among the same number of "
                                "query heads; use a kv_heads that divides " +
                                str(model.heads));
    noteField("model.heads", model.heads);
  }
  for (const LayerGroup &g : model.layers) {
    if (g.kind != LayerGroup::Transformer)
      continue;
    if (headsSplitHidden && g.heads != model.heads && model.hidden % g.heads != 0) {
      diags.error(g.range, "layer '" + g.name + "' has heads = " + str(g.heads) +
                               ", which does not divide hidden = " + str(model.hidden) +
                               ": every attention head needs the same width; use heads = " +
                               divisorsUpTo(model.hidden, g.heads));
      noteField("model.hidden", model.hidden);
      failed = true;
    }
    bool overridesAttention = g.heads != model.heads || g.kvHeads != model.kvHeads;
    if (overridesAttention && g.kvHeads != g.heads && g.heads % g.kvHeads != 0) {
      diags.error(g.range, "layer '" + g.name + "' has kv_heads = " + str(g.kvHeads) +
                               ", which does not divide its heads = " + str(g.heads) +
                               "; use a kv_heads that divides " + str(g.heads));
      failed = true;
    }
  }
}

/// Megatron splits attention by heads and the MLP by its ffn columns, so both must split
/// evenly over tp. Key/value heads may also be replicated when tp exceeds them. A layer only
/// answers for the sizes it overrides; the model's own are checked once, with layer = null.
void MappingChecker::checkTensorSplit(const LayerGroup *layer) {
  int64_t heads = layer ? layer->heads : model.heads;
  int64_t kvHeads = layer ? layer->kvHeads : model.kvHeads;
  int64_t ffn = layer ? layer->ffn : model.ffn;
  bool ownHeads = !layer || heads != model.heads;
  bool ownKvHeads = !layer || kvHeads != model.kvHeads || ownHeads;
  bool ownFfn = !layer || ffn != model.ffn;
  int64_t tp = par.tp;
  int64_t hintLimit = std::max(tp, cluster.gpusPerNode);
  auto report = [&](llvm::StringRef field, const std::string &what, int64_t value,
                    const std::string &fix) {
    if (layer) {
      diags.error(layer->range, "layer '" + layer->name + "' has " + what +
                                    ", which tp = " + str(tp) + " does not split: " + fix);
      noteField("parallel.tp", tp);
      failed = true;
      return;
    }
    error("parallel.tp", "tp = " + str(tp) + " does not split the model's " + what + ": " + fix);
    noteField(field, value);
  };
  const unsigned failures = tensorSplitFailures(heads, kvHeads, ffn, tp);
  if (ownHeads && (failures & SplitsHeads))
    report("model.heads", "heads = " + str(heads), heads,
           "each tensor-parallel rank holds whole attention heads; use tp = " +
               divisorsUpTo(heads, hintLimit));
  if (ownKvHeads && (failures & SplitsKvHeads))
    report("model.kv_heads", "kv_heads = " + str(kvHeads), kvHeads,
           "tp must divide the key/value heads or be a multiple of them (each then "
           "replicated); use tp = " +
               divisorsUpTo(kvHeads, hintLimit) + " or a multiple of " + str(kvHeads));
  if (ownFfn && (failures & SplitsFfn))
    report("model.ffn", "ffn = " + str(ffn), ffn,
           "the MLP's columns split evenly over tensor-parallel ranks; use tp = " +
               divisorsUpTo(ffn, hintLimit));
}

void MappingChecker::checkVocab() {
  std::optional<int64_t> padded = paddedVocab(model.vocab, par.tp);
  if (!padded) {
    error("model.vocab", "vocab = " + str(model.vocab) +
                             " cannot be padded to a multiple of "
                             "128 x tp without overflow; use a "
                             "smaller vocab or tp");
    return;
  }
  mapping.paddedVocab = *padded;
  if (*padded != model.vocab)
    diags.note(at("model.vocab"),
               "vocab = " + str(model.vocab) + " is padded to " + str(*padded) +
                   ", a multiple of 128 x tp = " + str(128 * par.tp) +
                   ", so that the embedding and lm_head split evenly over tensor-parallel "
                   "ranks");
}

void MappingChecker::checkStages() {
  int64_t blocks = model.numBlocks();
  int64_t chunks = par.schedule == ScheduleKind::Interleaved ? par.chunks : 1;
  std::optional<int64_t> stages = checkedMul(par.pp, chunks);
  std::string stagesText = chunks > 1 ? "pp x chunks = " + str(par.pp) + " x " + str(chunks) +
                                            " = " + (stages ? str(*stages) : "too many")
                                      : "pp = " + str(par.pp);
  PartitionFailure why = PartitionFailure::Uneven;
  if (std::optional<StagePartition> partition =
          partitionBlocks(blocks, par.pp, chunks, par.stageLayers, &why)) {
    mapping.partition = std::move(*partition);
    return;
  }
  mapping.partition = StagePartition{par.pp, chunks, {}};
  switch (why) {
  case PartitionFailure::Uneven:
    error(chunks > 1 && blocks % par.pp == 0 ? "parallel.schedule" : "parallel.pp",
          "the " + str(blocks) + " transformer blocks do not split evenly into " + stagesText +
              " pipeline stages; make " + (chunks > 1 ? "pp x chunks" : "pp") + " divide " +
              str(blocks) + ", or list each stage's blocks with stage_layers = [...]");
    diags.note(firstTransformer().range, "the transformer blocks are declared here");
    return;
  case PartitionFailure::StageCount:
    error("parallel.stage_layers",
          "stage_layers has " + str(par.stageLayers.size()) + " entries but " + stagesText +
              (chunks > 1 ? " virtual pipeline stages need one each (chunk 0 of every stage "
                            "first, then chunk 1, ...)"
                          : " pipeline stages need one each") +
              "; give exactly " + (stages ? str(*stages) : "pp x chunks") + " entries");
    noteField("parallel.pp", par.pp);
    return;
  case PartitionFailure::BlockSum: {
    int64_t sum = 0;
    for (int64_t n : par.stageLayers)
      sum += n;
    error("parallel.stage_layers",
          "stage_layers places " + str(sum) + " transformer blocks but the model has " +
              str(blocks) + "; every block must sit on exactly one stage: make the entries "
              "sum to " + str(blocks));
    diags.note(firstTransformer().range, "the transformer blocks are declared here");
    return;
  }
  }
}

void MappingChecker::checkBatch() {
  // micro_batch <= MaxMicroBatch and seq <= MaxSeq: the product fits 64 bits.
  if (par.microBatch * model.seq > limits::MaxMicrobatchTokens) {
    error("parallel.micro_batch", "micro_batch x seq = " + str(par.microBatch) + " x " +
                                      str(model.seq) + " = " + str(par.microBatch * model.seq) +
                                      " tokens per microbatch, more than the limit of " +
                                      str(limits::MaxMicrobatchTokens));
    return;
  }
  if (!dpKnown)
    return;
  std::optional<int64_t> perStep = checkedMul(par.microBatch, mapping.dp);
  if (!perStep || par.globalBatch % *perStep != 0) {
    std::string perStepText = "micro_batch x dp = " + str(par.microBatch) + " x " + str(mapping.dp);
    error("parallel.global_batch",
          "global_batch = " + str(par.globalBatch) + " is not a multiple of " + perStepText +
              ": every data-parallel replica runs a whole number of microbatches; use "
              "global_batch = " +
              (perStep ? nearestMultiples(par.globalBatch, *perStep) : "a smaller micro_batch"));
    noteField("parallel.micro_batch", par.microBatch);
    return;
  }
  mapping.microbatches = par.globalBatch / *perStep;
  if (mapping.microbatches > limits::MaxMicrobatches) {
    error("parallel.global_batch",
          "M = global_batch / (micro_batch x dp) = " + str(mapping.microbatches) +
              " microbatches per step, more than the limit of " + str(limits::MaxMicrobatches) +
              "; raise micro_batch or lower global_batch");
    noteField("parallel.micro_batch", par.microBatch);
    return;
  }
  batchKnown = true;
}

/// A rank plan holds every op of its chunks and every instruction of its step; both are
/// bounded before lowering (docs/language.md, Limits) by an estimate above what lowering
/// produces: at most 128 ops per block plus 256 for the embedding and head, at most 16
/// instructions per chunk and microbatch plus 64 for the step's collectives.
void MappingChecker::checkPlanSize() {
  if (!batchKnown || mapping.partition.blocks.empty())
    return;
  int64_t blocks = 0;
  for (int64_t stage = 0; stage < par.pp; ++stage)
    blocks = std::max(blocks, mapping.partition.blocksOnStage(stage));
  // blocks <= MaxBlocks, chunks <= MaxBlocks and M <= MaxMicrobatches: no overflow.
  int64_t ops = 128 * blocks + 256;
  int64_t instructions = 16 * mapping.chunks * mapping.microbatches + 64;
  // pp x chunks <= MaxBlocks (a block per virtual stage): no overflow either.
  int64_t passes = stepPasses(par.pp, mapping.chunks, mapping.microbatches);
  if (passes > limits::MaxStepPasses)
    error("parallel.global_batch",
          "the step time is simulated over every forward and backward pass of the step, here "
          "2 x pp x chunks x M = " + str(passes) + ", more than the limit of " +
              str(limits::MaxStepPasses) + "; use fewer microbatches per step or fewer stages");
  if (ops + instructions <= limits::MaxPlanEntries)
    return;
  bool schedule = instructions >= ops;
  error(schedule ? "parallel.global_batch" : "parallel.pp",
        "a rank's plan would hold up to " + str(ops) + " ops (" + str(blocks) +
            " blocks on a stage) and " + str(instructions) + " instructions (" +
            str(mapping.chunks) + " chunks x M = " + str(mapping.microbatches) +
            "), more than the limit of " + str(limits::MaxPlanEntries) + " per rank; " +
            (schedule ? "use fewer microbatches per step" : "use more pipeline stages"));
}

void MappingChecker::checkSchedule() {
  if (par.schedule != ScheduleKind::Interleaved)
    return;
  if (par.chunks < 2)
    error("parallel.schedule", "interleaved(chunks = " + str(par.chunks) +
                                   ") gives each pipeline rank a single model chunk, which is "
                                   "plain 1f1b; use chunks >= 2 or schedule = 1f1b");
  if (par.pp < 2) {
    error("parallel.schedule", "the interleaved schedule needs a pipeline, but pp = " +
                                   str(par.pp) + "; set pp >= 2 or use schedule = 1f1b");
    noteField("parallel.pp", par.pp);
    return;
  }
  if (batchKnown && mapping.microbatches % par.pp != 0) {
    std::optional<int64_t> step = checkedMul(par.microBatch * mapping.dp, par.pp);
    error("parallel.global_batch",
          "the interleaved schedule runs microbatches in groups of pp = " + str(par.pp) +
              ", but M = global_batch / (micro_batch x dp) = " + str(mapping.microbatches) +
              " is not a multiple of it; use global_batch = " +
              (step ? nearestMultiples(par.globalBatch, *step) : "a multiple of pp"));
    diags.note(at("parallel.schedule"), "the interleaved schedule is chosen here");
  }
}

void MappingChecker::checkFlags() {
  if (par.sequenceParallel && par.tp == 1) {
    error("parallel.sequence_parallel",
          "sequence_parallel splits the activations of norms and dropout across the "
          "tensor-parallel group, which needs tp > 1; remove it or raise tp");
    noteField("parallel.tp", par.tp);
  } else if (par.sequenceParallel && !sequenceParallelSplits(model, par.tp, par.cp)) {
    // Each tp rank keeps seq / (cp x tp) positions between the tensor-parallel regions.
    std::string positions = par.cp > 1 ? "each rank's seq / cp = " + str(model.seq / par.cp) +
                                             " positions"
                                       : "the sequence";
    error("parallel.sequence_parallel",
          "sequence_parallel splits " + positions + " over tp = " + str(par.tp) +
              ", but seq = " + str(model.seq) + " is not a multiple of " +
              (par.cp > 1 ? "cp x tp = " + str(par.cp * par.tp) : std::string("it")) +
              "; use a seq divisible by " + (par.cp > 1 ? "cp x tp" : "tp") +
              " or turn sequence_parallel off");
    noteField("model.seq", model.seq);
  }
  if (par.zero >= 1 && dpKnown && !zeroPolicy(par, mapping.gradientRanks()).partitioned()) {
    diags.warning(at("parallel.zero"), "zero = " + str(par.zero) +
                                           " shards state across data-parallel ranks, but "
                                           "dp = 1: it saves no memory; set zero = 0 or "
                                           "raise dp");
  }
}

std::optional<Mapping> MappingChecker::run() {
  mapping.tp = par.tp;
  mapping.pp = par.pp;
  mapping.cp = par.cp;
  mapping.chunks = par.schedule == ScheduleKind::Interleaved ? par.chunks : 1;
  mapping.microBatch = par.microBatch;
  mapping.globalBatch = par.globalBatch;

  checkWorld();
  checkModelShape();
  checkTensorSplit(nullptr);
  for (const LayerGroup &g : model.layers)
    if (g.kind == LayerGroup::Transformer)
      checkTensorSplit(&g);
  checkVocab();
  checkStages();
  checkBatch();
  checkPlanSize();
  checkSchedule();
  checkFlags();
  checkContext();
  checkExperts();
  if (dpKnown) {
    int64_t ep = (mapping.dp * par.cp) % par.ep == 0 ? par.ep : 1;
    mapping.layout =
        RankLayout(par.tp, par.pp, mapping.dp, par.order, cluster.gpusPerNode, par.cp, ep);
    checkExpertGrid();
    warnTensorAcrossNodes();
    warnContextAcrossNodes();
  }
  warnBubble();
  if (failed)
    return std::nullopt;
  return mapping;
}

} // namespace parc::rules

namespace parc {
std::optional<Mapping> checkMapping(const Program &program, DiagnosticEngine &diags) {
  return rules::MappingChecker(program, diags).run();
}
} // namespace parc
