//===- MemoryModel.cpp - Parameters, model states and activations per rank ===//
//
// Formulas and their sources: docs/memory-and-cost.md.
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/MemoryModel.h"

#include <algorithm>
#include <cmath>

namespace parc {

bool hasLinearBiases(const ModelSpec &model) { return model.bias == LinearBias::All; }
bool hasQKVBias(const ModelSpec &model) { return model.bias != LinearBias::None; }

int64_t headDim(const ModelSpec &model, const LayerGroup &block) {
  if (model.headDim > 0)
    return model.headDim;
  return block.heads > 0 ? model.hidden / block.heads : model.hidden;
}

namespace {
int64_t normParams(const ModelSpec &model) {
  // LayerNorm has a gain and a bias per feature, RMSNorm only the gain.
  return model.norm == Norm::LayerNorm ? 2 * model.hidden : model.hidden;
}
} // namespace

namespace {
/// A dense MLP of `f` columns: up (and gate) column-parallel, down row-parallel.
void addDenseMLP(const ModelSpec &model, const LayerGroup &block, int64_t f, ParamCount &p) {
  const int64_t h = model.hidden, mlpIn = isGated(block.mlp) ? 2 * f : f;
  const bool bias = hasLinearBiases(model);
  p.sharded += h * mlpIn + (bias ? mlpIn : 0); // MLP up (and gate)
  p.sharded += f * h;                          // MLP down
  p.replicated += bias ? h : 0;
}
} // namespace

BlockHalves blockHalves(const ModelSpec &model, const LayerGroup &block) {
  const int64_t h = model.hidden, d = headDim(model, block);
  const int64_t q = block.heads * d, kv = block.kvHeads * d;
  const bool bias = hasLinearBiases(model), qkvBias = hasQKVBias(model);
  BlockHalves halves;
  // Column-parallel layers split their weight and bias; row-parallel layers split the weight
  // and keep the bias whole, since it is added after the all-reduce.
  ParamCount &a = halves.attention;
  a.sharded += h * q + (qkvBias ? q : 0); // Q
  a.keyValue = h * 2 * kv + (qkvBias ? 2 * kv : 0);
  a.kvHeads = block.kvHeads;
  a.sharded += q * h; // attention output projection
  a.replicated += (bias ? h : 0) + normParams(model);
  ParamCount &m = halves.mlp;
  const MoESpec &moe = block.moe;
  if (moe.enabled()) {
    // The router (no bias), then experts without biases, as Mixtral's and DeepSeek's.
    m.replicated += moe.experts * h;
    const int64_t f = moe.ffn, expertIn = isGated(block.mlp) ? 2 * f : f;
    m.expert = moe.experts * (h * expertIn + f * h);
    m.activeExpert = m.expert / moe.experts * moe.topK;
    if (moe.sharedExperts)
      addDenseMLP(model, block, moe.sharedFfn(), m);
  } else {
    addDenseMLP(model, block, block.ffn, m);
  }
  m.replicated += normParams(model);
  return halves;
}

ParamCount blockParams(const ModelSpec &model, const LayerGroup &block) {
  BlockHalves halves = blockHalves(model, block);
  ParamCount p = halves.attention;
  p += halves.mlp;
  return p;
}

ParamCount embeddingParams(const ModelSpec &model, int64_t paddedVocab) {
  ParamCount p;
  p.sharded = paddedVocab * model.hidden; // vocab-parallel
  if (model.position == Position::Learned)
    p.replicated = model.positions() * model.hidden;
  return p;
}

ParamCount headParams(const ModelSpec &model, int64_t paddedVocab) {
  ParamCount p;
  p.sharded = paddedVocab * model.hidden;
  return p;
}

ParamCount finalNormParams(const ModelSpec &model) {
  ParamCount p;
  p.replicated = normParams(model);
  return p;
}

namespace {
ParamCount modelParams(const ModelSpec &model, int64_t paddedVocab) {
  ParamCount p = embeddingParams(model, paddedVocab);
  for (const LayerGroup &g : model.layers)
    if (g.kind == LayerGroup::Transformer) {
      ParamCount block = blockParams(model, g);
      for (int64_t i = 0; i < g.count; ++i)
        p += block;
    }
  p += finalNormParams(model);
  if (!model.tiedHead())
    p += headParams(model, paddedVocab);
  return p;
}
} // namespace

int64_t totalParams(const ModelSpec &model, int64_t paddedVocab) {
  return modelParams(model, paddedVocab).total();
}

int64_t activeParams(const ModelSpec &model, int64_t paddedVocab) {
  return modelParams(model, paddedVocab).active();
}

ExpertRows expertRows(const MoESpec &moe, double tokens, int64_t ep) {
  ExpertRows rows;
  if (!moe.enabled())
    return rows;
  const double k = double(moe.topK), experts = double(moe.experts);
  rows.expected = tokens * k;
  double local = experts / double(ep);
  rows.bound = double(ep) * tokens * std::min(k, local);
  if (!moe.dropless()) {
    double perExpert = std::ceil(moe.capacity * tokens * k / experts);
    rows.bound = std::min(rows.bound, experts * perExpert);
    rows.expected = std::min(rows.expected, rows.bound);
  }
  return rows;
}

std::vector<ParamUnit> virtualStageUnits(const ModelSpec &model, const Mapping &mapping,
                                         int64_t virtualStage) {
  const int64_t tp = mapping.tp, virtualStages = mapping.pp * mapping.chunks;
  auto [first, last] = mapping.partition.blocks[size_t(virtualStage)];
  std::vector<ParamUnit> units;
  auto add = [&](ParamUnitKind kind, const ParamCount &count, int64_t block = -1) {
    units.push_back({kind, block, count.densePerRank(tp)});
  };
  if (virtualStage == virtualStages - 1) {
    if (!model.tiedHead() || virtualStages > 1)
      add(ParamUnitKind::Head, headParams(model, mapping.paddedVocab));
    add(ParamUnitKind::FinalNorm, finalNormParams(model));
  }
  for (int64_t i = last - 1; i >= first; --i) {
    BlockHalves halves = blockHalves(model, model.blockGroup(i));
    add(ParamUnitKind::MLP, halves.mlp, i);
    add(ParamUnitKind::Attention, halves.attention, i);
  }
  if (virtualStage == 0) {
    ParamCount embedding = embeddingParams(model, mapping.paddedVocab);
    if (embedding.replicated > 0) {
      ParamCount positions;
      positions.replicated = embedding.replicated;
      add(ParamUnitKind::PositionEmbedding, positions);
    }
    ParamCount word;
    word.sharded = embedding.sharded;
    add(ParamUnitKind::WordEmbedding, word);
  }
  return units;
}

bool headReadsWordEmbedding(const ModelSpec &model, const Mapping &mapping) {
  return model.tiedHead() && mapping.pp * mapping.chunks == 1;
}

std::vector<ParamUnit> expertUnits(const ModelSpec &model, const Mapping &mapping,
                                   int64_t virtualStage) {
  auto [first, last] = mapping.partition.blocks[size_t(virtualStage)];
  std::vector<ParamUnit> units;
  for (int64_t i = last - 1; i >= first; --i)
    if (int64_t n = blockParams(model, model.blockGroup(i)).expertPerRank(mapping.tp, mapping.ep))
      units.push_back({ParamUnitKind::Experts, i, n});
  return units;
}

StateBytesPerParam stateBytesPerParam(const Program &program) {
  StateBytesPerParam b;
  b.weight = double(bytesPerElement(program.model.dtype));
  b.grad = double(bytesPerElement(program.train.gradDtype));
  // Mixed precision keeps an fp32 master copy for the update; an fp32 model updates in place.
  double master = program.model.dtype == DType::FP32 ? 0 : 4;
  double moments = 0;
  if (program.train.optimizer == Optimizer::Adam)
    moments = 8; // first and second moment, fp32
  else if (program.train.momentum != 0)
    moments = 4; // SGD's momentum buffer; plain SGD keeps none
  b.optimizer = master + moments;
  return b;
}

std::vector<int64_t> microbatchesInFlight(ScheduleKind schedule, int64_t pp, int64_t stage,
                                          int64_t microbatches, int64_t chunks) {
  if (schedule == ScheduleKind::GPipe)
    return {microbatches};
  if (schedule == ScheduleKind::OneFOneB)
    return {std::min(pp - stage, microbatches)};
  // Megatron-LM's forward_backward_pipelining_with_interleaving: the warm-up forwards, then one
  // more before the first backward frees anything.
  const int64_t total = microbatches * chunks;
  int64_t warmup = (pp - stage - 1) * 2 + (chunks - 1) * pp;
  if (microbatches == pp)
    warmup = total;
  const int64_t peak = std::min(warmup + 1, total);
  // Forward k runs model chunk (k mod (pp * chunks)) / pp, as Megatron's get_model_chunk_id:
  // each whole round of pp * chunks forwards gives every chunk pp, and the partial round fills
  // the chunks in order (counted, not walked: the search asks for every stage of thousands of
  // candidates, and this loop took pp^2 x chunks steps per candidate).
  const int64_t round = pp * chunks, rounds = peak / round, rest = peak % round;
  std::vector<int64_t> perChunk(size_t(chunks), 0);
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    perChunk[size_t(chunk)] = rounds * pp + std::clamp(rest - chunk * pp, int64_t(0), pp);
  return perChunk;
}

const StageMemory &MemoryEstimate::worst() const {
  const StageMemory *best = &stages.front();
  for (const StageMemory &s : stages)
    if (s.total() > best->total())
      best = &s;
  return *best;
}

namespace {

/// The largest parameter gradient an op of the stage writes through a scratch copy because it
/// cannot add in place: under mixed precision every one (so the largest parameter), else only
/// the sum of a key/value head shared by several tp ranks (one head's projection).
int64_t largestScratchGradient(const Program &program, const Mapping &mapping,
                               const std::vector<ParamUnit> &units) {
  const ModelSpec &model = program.model;
  const bool mixed = program.train.gradDtype != model.dtype;
  int64_t largest = 0;
  for (const ParamUnit &unit : units) {
    if (!isSubLayer(unit.kind)) {
      largest = std::max(largest, mixed ? unit.elements : 0);
      continue;
    }
    const LayerGroup &block = model.blockGroup(unit.block);
    int64_t d = headDim(model, block);
    if (mixed)
      largest = std::max(largest, model.hidden *
                                      (unit.kind == ParamUnitKind::MLP ? block.ffn
                                                                       : block.heads * d) /
                                      mapping.tp);
    else if (unit.kind == ParamUnitKind::Attention && block.kvHeads < mapping.tp)
      largest = std::max(largest, model.hidden * d);
  }
  return largest;
}

/// One family of parameters ZeRO shards over one group: the dense ones over dp, a MoE
/// block's experts over the expert-data-parallel group (the ranks that hold the same experts).
struct StateFamily {
  ZeroPolicy policy;
  std::vector<std::vector<ParamUnit>> chunks; // backward-ordered units of each chunk
};

/// ZeRO 1's reduce-scatters of one stage, both families, chunk by chunk in schedule order (a
/// chunk's dense buckets, then its experts'): (whole, owned) elements of each bucket.
struct StepEndReductions {
  std::vector<std::vector<std::pair<double, double>>> chunks;
  double whole = 0;

  /// Elements above the whole buckets at the peak: each reduce-scatter adds its owned shard
  /// before it releases its whole bucket.
  double transientPeak() const {
    double left = whole, shards = 0, peak = whole;
    for (const auto &chunk : chunks)
      for (auto [bucketWhole, bucketOwned] : chunk) {
        shards += bucketOwned;
        peak = std::max(peak, left + shards);
        left -= bucketWhole;
      }
    return peak - whole;
  }
};

/// Weights, gradients and optimizer state of one family of the stage, added to `m`, with the
/// transient buffers: the copies ops write their gradients through and ZeRO 1's whole
/// gradient buckets (its reductions go to `stepEnd`); zero 2 and 3's whole buckets are both
/// families' at once (gradientPeak, in estimateMemory).
void addModelStates(const Program &program, const Mapping &mapping, const StateFamily &family,
                    StageMemory &m, StepEndReductions &stepEnd) {
  const ModelSpec &model = program.model;
  const ZeroPolicy &policy = family.policy;
  const StateBytesPerParam perParam = stateBytesPerParam(program);
  const double elementBytes = double(bytesPerElement(model.dtype));
  std::vector<ParamUnit> all;
  double owned = 0, padded = 0;
  std::vector<std::vector<std::pair<double, double>>> reductions(family.chunks.size());
  for (size_t c = 0; c < family.chunks.size(); ++c) {
    const std::vector<ParamUnit> &units = family.chunks[c];
    all.insert(all.end(), units.begin(), units.end());
    for (const ZeroBucket &bucket : policy.buckets(units)) {
      double whole = double(bucket.padded(policy.dp));
      owned += double(bucket.perMember);
      padded += whole;
      reductions[c].push_back({whole, double(bucket.perMember)});
    }
  }
  int64_t elements = 0;
  for (const ParamUnit &unit : all)
    elements += unit.elements;
  m.paramsPerRank += elements;
  const double n = double(elements);
  const double opScratch = double(largestScratchGradient(program, mapping, all)) * elementBytes;

  if (!policy.partitioned()) {
    m.weights += n * perParam.weight;
    m.grads += n * perParam.grad;
    m.optimizer += n * perParam.optimizer;
    m.gradBuffers += opScratch;
    return;
  }
  m.optimizer += owned * perParam.optimizer;
  m.weights += (policy.shardsWeights() ? owned : padded) * perParam.weight;
  if (!policy.shardsGrads()) {
    // Whole buckets through the step, reduce-scattered at its end (StepEndReductions).
    m.grads += padded * perParam.grad;
    m.gradBuffers += opScratch;
    stepEnd.whole += padded;
    stepEnd.chunks.resize(std::max(stepEnd.chunks.size(), reductions.size()));
    for (size_t c = 0; c < reductions.size(); ++c)
      stepEnd.chunks[c].insert(stepEnd.chunks[c].end(), reductions[c].begin(),
                               reductions[c].end());
    return;
  }
  // The whole buckets being written: estimateMemory adds both families' at once.
  m.grads += owned * perParam.grad;
  m.gradBuffers += opScratch;
}

} // namespace

MemoryEstimate estimateMemory(const Program &program, const Mapping &mapping) {
  const ParallelSpec &par = program.parallel;
  const ZeroPolicy policy = zeroPolicy(par, mapping.gradientRanks());
  MemoryEstimate est;
  est.gpuMemory = program.cluster.gpuMemory;
  for (int64_t stage = 0; stage < mapping.pp; ++stage) {
    StageMemory m;
    m.stage = stage;
    std::vector<int64_t> inFlight =
        microbatchesInFlight(par.schedule, mapping.pp, stage, mapping.microbatches, mapping.chunks);
    StateFamily dense{policy, {}}, experts{zeroPolicy(par, mapping.expertDp()), {}};
    for (int64_t chunk = 0; chunk < mapping.chunks; ++chunk) {
      auto [first, last] = mapping.partition.range(stage, chunk);
      const int64_t virtualStage = chunk * mapping.pp + stage;
      dense.chunks.push_back(virtualStageUnits(program.model, mapping, virtualStage));
      experts.chunks.push_back(expertUnits(program.model, mapping, virtualStage));
      for (const ParamUnit &unit : experts.chunks.back())
        m.expertParamsPerRank += unit.elements;
      m.blocks += last - first;
      m.inFlight += inFlight[size_t(chunk)];
    }
    StepEndReductions stepEnd;
    addModelStates(program, mapping, dense, m, stepEnd);
    if (program.model.hasExperts())
      addModelStates(program, mapping, experts, m, stepEnd);
    m.gradBuffers += stepEnd.transientPeak() * stateBytesPerParam(program).grad;
    // ZeRO-3's gathered buckets and zero 2 and 3's whole gradient buckets, both families, one
    // chunk's pass at a time.
    double gradPeak = 0;
    for (size_t c = 0; c < dense.chunks.size(); ++c) {
      ChunkUnits units{dense.policy, dense.chunks[c], experts.policy, experts.chunks[c],
                       mapping.ep == 1, headReadsWordEmbedding(program.model, mapping)};
      double peak =
          gathersAroundUse(program.model, units, par.recompute == Recompute::Full).peak;
      m.gathered = std::max(m.gathered, peak * stateBytesPerParam(program).weight);
      gradPeak = std::max(gradPeak, gradientPeak(program.model, units));
    }
    m.gradBuffers += gradPeak * stateBytesPerParam(program).grad;
    m.activations = stageActivationBytes(program, mapping, stage, inFlight);
    if (program.model.hasExperts())
      m.expertWorstCase =
          stageActivationBytes(program, mapping, stage, inFlight, /*worstRouting=*/true) -
          m.activations;
    m.reserve = double(program.cluster.gpuReserve);
    est.stages.push_back(m);
  }
  return est;
}

} // namespace parc
