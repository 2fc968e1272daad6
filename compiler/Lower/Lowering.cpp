//===- Lowering.cpp - Program + Mapping -> one execution plan per rank ----===//
//
// A rank plan is assembled from pieces shared by many ranks: a virtual stage's chunk and
// parameter shards depend only on (virtual stage, tp rank), and a stage's pipeline program
// only on the stage. PlanLowerer builds each piece once, so one rank costs one chunk per model
// chunk and all ranks cost little more than copying; ranks are lowered and verified on all
// cores.
//
//===----------------------------------------------------------------------===//
#include "parc/Lower/Lowering.h"

#include "LowerInternal.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Plan/PlanJSON.h"

#include "llvm/Support/Parallel.h"

#include <cmath>
#include <memory>

namespace parc {

namespace {

plan::ModelSummary modelSummary(const Program &program, const Mapping &mapping) {
  const ModelSpec &m = program.model;
  plan::ModelSummary s;
  s.name = m.name;
  s.dtype = lower::toPlan(m.dtype);
  s.vocab = m.vocab;
  s.paddedVocab = mapping.paddedVocab;
  s.seq = m.seq;
  s.hidden = m.hidden;
  s.heads = m.heads;
  s.kvHeads = m.kvHeads;
  s.headDim = m.headDim ? m.headDim : m.hidden / m.heads;
  s.ffn = m.ffn;
  s.layers = m.numBlocks();
  s.norm = m.norm == Norm::LayerNorm ? plan::Norm::LayerNorm : plan::Norm::RMSNorm;
  s.mlp = m.mlp == MLPKind::GELU ? plan::MLP::GELU : plan::MLP::SwiGLU;
  s.position = m.position == Position::Learned ? plan::Position::Learned : plan::Position::RoPE;
  s.tiedEmbeddings = m.tiedHead();
  return s;
}

plan::ParallelSummary parallelSummary(const Program &program, const Mapping &mapping) {
  const ParallelSpec &par = program.parallel;
  plan::ParallelSummary s;
  s.tp = mapping.tp;
  s.pp = mapping.pp;
  s.dp = mapping.dp;
  s.cp = mapping.cp;
  s.ep = mapping.ep;
  // A size-1 cp sits where Megatron-Core's default puts it, right after tp, wherever the order
  // named it: orders that differ only there are one layout, and their plans are one plan.
  s.order.clear();
  for (Axis a : mapping.layout.grid.order().axes()) {
    if (a == Axis::EP || (a == Axis::CP && mapping.cp == 1))
      continue;
    s.order.push_back(lower::toPlan(a));
    if (a == Axis::TP && mapping.cp == 1)
      s.order.push_back(plan::Group::CP);
  }
  s.chunks = mapping.chunks;
  s.microBatch = mapping.microBatch;
  s.microbatches = mapping.microbatches;
  s.globalBatch = mapping.globalBatch;
  s.schedule = par.schedule == ScheduleKind::GPipe      ? plan::Schedule::GPipe
               : par.schedule == ScheduleKind::OneFOneB ? plan::Schedule::OneFOneB
                                                        : plan::Schedule::Interleaved;
  s.zero = par.zero;
  s.bucketSize = par.bucketSize;
  s.recompute = par.recompute == Recompute::None        ? plan::Recompute::None
                : par.recompute == Recompute::Selective ? plan::Recompute::Selective
                                                        : plan::Recompute::Full;
  s.sequenceParallel = par.sequenceParallel;
  return s;
}

plan::TrainSettings trainSettings(const Program &program) {
  const TrainSpec &t = program.train;
  plan::TrainSettings s;
  s.optimizer = t.optimizer == Optimizer::Adam ? plan::Optimizer::Adam : plan::Optimizer::SGD;
  s.lr = t.lr;
  s.betas = {t.beta1, t.beta2};
  s.eps = t.eps;
  s.momentum = t.momentum;
  s.weightDecay = t.weightDecay;
  s.gradClip = t.gradClip;
  s.steps = t.steps;
  s.seed = t.seed;
  s.warmupSteps = t.warmupSteps;
  s.gradDtype = lower::toPlan(t.gradDtype);
  return s;
}

class PlanLowerer {
public:
  PlanLowerer(const Program &program, const Mapping &mapping, llvm::StringRef planId)
      : job(program, mapping), planId(planId.str()),
        stagePrograms(buildPipelineSchedule(job.pipeline)),
        chunkCache(size_t(job.virtualStages() * job.tp * job.cp)) {
    // The template every rank plan starts from: the summaries are the same everywhere.
    blank.planId = this->planId;
    blank.world = mapping.layout.world();
    blank.model = modelSummary(program, mapping);
    blank.cluster = plan::ClusterSummary{program.cluster.name, program.cluster.nodes,
                                         program.cluster.gpusPerNode};
    blank.parallel = parallelSummary(program, mapping);
    blank.train = trainSettings(program);
    memory = estimateMemory(program, mapping);
  }

  /// Lowers every chunk a rank may use, after which lower() only reads the cache and may run
  /// on several threads at once.
  void lowerAllChunks() {
    llvm::parallelForEachN(0, chunkCache.size(), [&](size_t i) {
      int64_t slot = int64_t(i);
      chunkCache[i] = std::make_unique<lower::LoweredChunk>(lower::lowerChunk(
          job, slot / (job.tp * job.cp), slot / job.cp % job.tp, slot % job.cp));
    });
  }

  plan::RankPlan lower(int64_t rank) {
    const RankLayout &layout = job.mapping.layout;
    Coords coords = layout.coordsOf(rank);
    plan::RankPlan plan = blank;
    plan.rank = rank;
    plan.node = layout.nodeOf(rank);
    plan.localRank = layout.localRankOf(rank);
    plan.coords = plan::Coords{coords.tp, coords.pp, coords.dp, coords.cp};
    const StageMemory &stage = memory.stages[size_t(coords.pp)];
    plan.predictedMemory = {std::llround(stage.weights + stage.gathered),
                            std::llround(stage.grads + stage.gradBuffers),
                            std::llround(stage.optimizer),
                            // Dropless, the plans hold the all-to-all's worst case, whatever
                            // the router does.
                            std::llround(stage.activations + stage.expertWorstCase),
                            std::llround(stage.reserve)};
    plan.groups.tp = layout.tpGroup(rank);
    plan.groups.pp = layout.ppGroup(rank);
    plan.groups.dp = layout.dpGroup(rank);
    plan.groups.model = layout.modelGroup(rank);
    plan.groups.cp = layout.cpGroup(rank);
    plan.groups.dpCp = layout.dpCpGroup(rank);
    plan.groups.ep = layout.epGroup(rank);
    plan.groups.expertDp = layout.expertDataGroup(rank);
    // RankLayout gives every rank of a pipeline its ends; only the ends are members.
    if (coords.pp == 0 || coords.pp == job.pp - 1)
      plan.groups.embedding = layout.embeddingGroup(rank, job.tiedHead);

    lower::ScheduleInputs inputs;
    inputs.job = &job;
    inputs.program = &stagePrograms[coords.pp];
    inputs.ppGroup = &plan.groups.pp;
    inputs.inEmbeddingGroup = !plan.groups.embedding.empty();
    for (int64_t c = 0; c < job.mapping.chunks; ++c) {
      const lower::LoweredChunk &lowered = chunkFor(c * job.pp + coords.pp, coords.tp, coords.cp);
      plan.chunks.push_back(lowered.chunk);
      size_t first = plan.params.size();
      plan.params.insert(plan.params.end(), lowered.params.begin(), lowered.params.end());
      lower::placeOnExpertRank(job, layout.epRankOf(rank),
                               llvm::MutableArrayRef<plan::ParamShard>(plan.params).drop_front(first));
      std::vector<std::string> &names = inputs.chunkParams.emplace_back();
      for (const plan::ParamShard &shard : lowered.params)
        names.push_back(shard.name);
      inputs.chunkUnits.push_back(&lowered.units);
      inputs.chunks.push_back(&lowered.chunk);
      inputs.tpPartialGrads.insert(inputs.tpPartialGrads.end(), lowered.tpPartialGrads.begin(),
                                   lowered.tpPartialGrads.end());
      if (lowered.chunk.hasEmbedding || lowered.chunk.hasHead)
        inputs.batchChunk = c;
    }
    plan.schedule = lower::lowerSchedule(inputs);
    return plan;
  }

private:
  /// The chunks of one virtual stage depend on the tp and cp rank only.
  const lower::LoweredChunk &chunkFor(int64_t virtualStage, int64_t tpRank, int64_t cpRank) {
    std::unique_ptr<lower::LoweredChunk> &slot =
        chunkCache[(virtualStage * job.tp + tpRank) * job.cp + cpRank];
    if (!slot)
      slot = std::make_unique<lower::LoweredChunk>(
          lower::lowerChunk(job, virtualStage, tpRank, cpRank));
    return *slot;
  }

  lower::Job job;
  std::string planId;
  std::vector<StageProgram> stagePrograms;
  std::vector<std::unique_ptr<lower::LoweredChunk>> chunkCache;
  MemoryEstimate memory; // per pipeline stage, the same for all ranks of a stage
  plan::RankPlan blank;
};

llvm::Error internalError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "internal error: " + message.str());
}

} // namespace

namespace {
/// The manifest's job description without its rank list, which the description determines.
plan::Manifest jobSummary(const Program &program, const Mapping &mapping) {
  plan::Manifest manifest;
  manifest.world = mapping.layout.world();
  manifest.model = modelSummary(program, mapping);
  manifest.cluster = plan::ClusterSummary{program.cluster.name, program.cluster.nodes,
                                          program.cluster.gpusPerNode};
  manifest.parallel = parallelSummary(program, mapping);
  manifest.train = trainSettings(program);
  return manifest;
}
} // namespace

plan::Manifest buildManifest(const Program &program, const Mapping &mapping,
                             llvm::StringRef planId) {
  plan::Manifest manifest = jobSummary(program, mapping);
  manifest.planId = planId.str();
  const RankLayout &layout = mapping.layout;
  manifest.ranks.reserve(size_t(manifest.world));
  for (int64_t rank = 0; rank < manifest.world; ++rank) {
    Coords c = layout.coordsOf(rank);
    manifest.ranks.push_back(plan::RankEntry{rank, layout.nodeOf(rank), layout.localRankOf(rank),
                                             plan::Coords{c.tp, c.pp, c.dp, c.cp},
                                             plan::rankFileName(rank)});
  }
  return manifest;
}

namespace {
bool usesMLP(const ModelSpec &model, MLPKind kind) {
  return llvm::any_of(model.layers, [&](const LayerGroup &g) {
    return g.kind == LayerGroup::Transformer && g.mlp == kind;
  });
}
} // namespace

namespace {
/// A setting the language describes (for estimates and exports) but parrun does not run: the
/// field it is reported at and why.
struct Refusal {
  bool refused;
  const char *field, *why;
};

/// Mixture-of-experts blocks are lowered with expert tensor parallelism = tp, without context
/// parallelism and dropless; other mappings are checked and estimated but not run. A refused setting is reported once, at its field, with a note
/// at the first MoE layer.
bool checkMoELowerable(const Program &program, const Mapping &mapping, DiagnosticEngine &diags) {
  const ModelSpec &m = program.model;
  auto first = llvm::find_if(m.layers, [](const LayerGroup &g) {
    return g.kind == LayerGroup::Transformer && g.moe.enabled();
  });
  if (first == m.layers.end())
    return true;
  // A plan's parallel.order names tp, cp, dp and pp only, from which the plan verifier puts
  // ep just below dp (expertOrder); an order that puts it elsewhere has no plan spelling.
  std::vector<Axis> dense;
  for (Axis a : mapping.layout.grid.order().namedAxes())
    if (a != Axis::EP)
      dense.push_back(a);
  const bool epPlaced = mapping.layout.expertGrid.order() == expertOrder(RankOrder(dense)) ||
                        mapping.ep == 1;
  const Refusal refusals[] = {
      {mapping.cp > 1, "cp",
       "under context parallelism the router's load-balancing loss would see part of each "
       "sequence; plans of MoE models need cp = 1"},
      {!epPlaced, "order",
       "an order that places ep other than just below dp cannot be written to a plan, whose "
       "parallel.order names tp, cp, dp and pp; leave ep out of the order"},
  };
  bool ok = true;
  for (const auto &r : refusals)
    if (r.refused) {
      diags.error(program.rangeOf(std::string("parallel.") + r.field, program.parallel.headerRange),
                  std::string(r.field) + " cannot be planned for mixture-of-experts layers " +
                      "here: " + r.why);
      diags.note(first->range, "layer '" + first->name + "' has " +
                                   std::to_string(first->moe.experts) + " experts");
      ok = false;
    }
  for (const LayerGroup &g : m.layers)
    if (g.kind == LayerGroup::Transformer && g.moe.enabled() && !g.moe.dropless()) {
      diags.error(g.range, "layer '" + g.name + "' drops tokens past a capacity factor, which "
                           "is estimated but not run: parrun routes dropless; leave 'capacity' "
                           "unset to write plans");
      ok = false;
    }
  return ok;
}
} // namespace

bool checkLowerable(const Program &program, const Mapping &mapping, DiagnosticEngine &diags) {
  const ModelSpec &m = program.model;
  bool gelu = usesMLP(m, MLPKind::GELU) || usesMLP(m, MLPKind::GeGLU);
  // What the language describes (for estimates and exports) but parrun does not run.
  const Refusal refusals[] = {
      {m.dropout > 0, "dropout",
       "dropout is estimated but not run: parrun's plans have no random masks; set "
       "'dropout = 0' to write plans"},
      {usesMLP(m, MLPKind::GeGLU), "mlp",
       "mlp = geglu is estimated but not run: parrun has no GeGLU kernel; plans need gelu or "
       "swiglu"},
      {gelu && m.gelu == GELUForm::Tanh, "gelu_approx",
       "gelu_approx = tanh is estimated but not run: parrun's GELU is the exact (erf) one; set "
       "'gelu_approx = none' to write plans"},
      {m.residual == Residual::Parallel, "residual",
       "residual = parallel is estimated but not run: parrun's blocks add attention and MLP "
       "in sequence; set 'residual = sequential' to write plans"},
      {m.position == Position::RoPE && m.rotaryFraction != 1, "rotary_fraction",
       "a partial rotary embedding is estimated but not run: parrun rotates whole heads; set "
       "'rotary_fraction = 1' to write plans"},
      {m.scaleEmbedding, "scale_embedding",
       "scale_embedding is estimated but not run: parrun does not scale the embeddings; set "
       "'scale_embedding = false' to write plans"},
  };
  bool ok = true;
  for (const auto &r : refusals)
    if (r.refused) {
      diags.error(program.rangeOf(std::string("model.") + r.field, m.nameRange), r.why);
      ok = false;
    }
  return checkMoELowerable(program, mapping, diags) && ok;
}

std::string computeJobPlanId(const Program &program, const Mapping &mapping) {
  // The rank list is left out: it follows from the summaries, and building it for a 16k-rank
  // job would cost `--rank=R` more than lowering that rank.
  return plan::computeJobPlanId(jobSummary(program, mapping));
}

plan::RankPlan lowerRank(const Program &program, const Mapping &mapping, int64_t rank,
                         llvm::StringRef planId) {
  return PlanLowerer(program, mapping, planId).lower(rank);
}

namespace {

/// `plans[rank]` verified on its own, as an internal error's text.
std::string verifyPlanOf(llvm::ArrayRef<plan::RankPlan> plans, size_t rank) {
  llvm::Error error = plan::verifyRankPlan(plans[rank]);
  if (!error)
    return "";
  return "internal error: the plan of rank " + std::to_string(rank) +
         " fails verification: " + llvm::toString(std::move(error));
}

/// What needs all plans at once: the set against its manifest, and the schedules together.
llvm::Error verifyTogether(const Program &program, const Mapping &mapping,
                           llvm::ArrayRef<plan::RankPlan> plans) {
  plan::Manifest manifest = buildManifest(program, mapping, computeJobPlanId(program, mapping));
  if (llvm::Error error = plan::verifyManifest(manifest))
    return internalError("the plan manifest fails verification: " +
                         llvm::toString(std::move(error)));
  if (llvm::Error error = plan::verifyPlanSet(manifest, plans))
    return internalError("the rank plans do not form one plan: " +
                         llvm::toString(std::move(error)));
  if (llvm::Error error = lower::checkRankSchedules(lower::Job(program, mapping), plans))
    return internalError(llvm::toString(std::move(error)));
  return llvm::Error::success();
}

} // namespace

llvm::Expected<std::vector<plan::RankPlan>> lowerAllRanks(const Program &program,
                                                          const Mapping &mapping) {
  PlanLowerer lowerer(program, mapping, computeJobPlanId(program, mapping));
  lowerer.lowerAllChunks();
  std::vector<plan::RankPlan> plans(size_t(mapping.layout.world()));
  // Each plan is verified while it is still in the cache of the core that built it.
  if (llvm::Error error = lower::firstFailure(plans.size(), [&](size_t rank) {
        plans[rank] = lowerer.lower(int64_t(rank));
        return verifyPlanOf(plans, rank);
      }))
    return {std::move(error)};
  if (llvm::Error error = verifyTogether(program, mapping, plans))
    return {std::move(error)};
  return plans;
}

llvm::Error verifyLoweredPlans(const Program &program, const Mapping &mapping,
                               llvm::ArrayRef<plan::RankPlan> plans) {
  if (llvm::Error error =
          lower::firstFailure(plans.size(), [&](size_t rank) { return verifyPlanOf(plans, rank); }))
    return error;
  return verifyTogether(program, mapping, plans);
}

} // namespace parc
