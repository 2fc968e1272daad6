//===- MemoryModel.cpp - Parameters, model states and activations per rank ===//
//
// Formulas and their sources: docs/memory-and-cost.md.
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/MemoryModel.h"

#include <algorithm>

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

ParamCount blockParams(const ModelSpec &model, const LayerGroup &block) {
  const int64_t h = model.hidden, d = headDim(model, block);
  const int64_t q = block.heads * d, kv = block.kvHeads * d, f = block.ffn;
  const int64_t mlpIn = isGated(block.mlp) ? 2 * f : f; // gate and up projections
  const bool bias = hasLinearBiases(model), qkvBias = hasQKVBias(model);
  ParamCount p;
  // Column-parallel layers split their weight and bias; row-parallel layers split the weight
  // and keep the bias whole, since it is added after the all-reduce.
  p.sharded += h * q + (qkvBias ? q : 0); // Q
  p.keyValue = h * 2 * kv + (qkvBias ? 2 * kv : 0);
  p.kvHeads = block.kvHeads;
  p.sharded += q * h;                                      // attention output projection
  p.replicated += bias ? h : 0;
  p.sharded += h * mlpIn + (bias ? mlpIn : 0); // MLP up (and gate)
  p.sharded += f * h;                          // MLP down
  p.replicated += bias ? h : 0;
  p.replicated += 2 * normParams(model);
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

int64_t totalParams(const ModelSpec &model, int64_t paddedVocab) {
  ParamCount p = embeddingParams(model, paddedVocab);
  for (int64_t i = 0, n = model.numBlocks(); i < n; ++i)
    p += blockParams(model, model.blockGroup(i));
  p += finalNormParams(model);
  if (!model.tiedHead())
    p += headParams(model, paddedVocab);
  return p.total();
}

std::vector<ParamUnit> virtualStageUnits(const ModelSpec &model, const Mapping &mapping,
                                         int64_t virtualStage) {
  const int64_t tp = mapping.tp, virtualStages = mapping.pp * mapping.chunks;
  auto [first, last] = mapping.partition.blocks[size_t(virtualStage)];
  std::vector<ParamUnit> units;
  auto add = [&](ParamUnitKind kind, const ParamCount &count, int64_t block = -1) {
    units.push_back({kind, block, count.perRank(tp)});
  };
  if (virtualStage == virtualStages - 1) {
    if (!model.tiedHead() || virtualStages > 1)
      add(ParamUnitKind::Head, headParams(model, mapping.paddedVocab));
    add(ParamUnitKind::FinalNorm, finalNormParams(model));
  }
  for (int64_t i = last - 1; i >= first; --i)
    add(ParamUnitKind::Block, blockParams(model, model.blockGroup(i)), i);
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

double blockActivationBytes(const ModelSpec &model, const LayerGroup &block, int64_t microBatch,
                            int64_t tp, Recompute recompute, bool sequenceParallel) {
  const double s = double(model.seq), b = double(microBatch), h = double(model.hidden);
  const double t = double(tp), e = double(bytesPerElement(model.dtype));
  const double d = double(headDim(model, block));
  const double q = double(block.heads) * d, kv = double(block.kvHeads) * d;
  const double f = double(block.ffn), a = double(block.heads);
  const double sb = s * b;

  if (recompute == Recompute::Full)
    return e * sb * h; // only the block's input survives the forward

  // Replicated across tp unless the sequence is split: the inputs of both norms, the inputs of
  // attention and MLP (the norms' outputs) and the two 1-byte dropout masks. 10sbh in 16 bits.
  double perSequence = e * 4 * sb * h + 2 * sb * h;
  // Always split by tp: Q, K, V, the attention output feeding the projection, and the MLP's
  // intermediate activations (GeLU: its input and output; SwiGLU: gate and up, then product).
  double split = e * sb * (q + 2 * kv + q);
  split += isGated(block.mlp) ? e * 3 * sb * f : e * 2 * sb * f;
  // The attention core: softmax output, its dropout mask and the dropout output, per head.
  // Selective recompute rebuilds exactly this part in the backward.
  double core = recompute == Recompute::Selective ? 0 : a * s * s * b * (e + 1 + e);
  if (sequenceParallel)
    return (perSequence + split + core) / t;
  return perSequence + (split + core) / t;
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
  std::vector<int64_t> perChunk(size_t(chunks), 0);
  // Forward k runs model chunk (k mod (pp * chunks)) / pp, as Megatron's get_model_chunk_id.
  for (int64_t k = 0; k < peak; ++k)
    ++perChunk[size_t((k % (pp * chunks)) / pp)];
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
/// The activations around the transformer blocks of one microbatch (Korthikanti et al. 2022,
/// section 4.3): the embedding's dropout mask on the first stage; on the last the final norm's
/// and the head's inputs and the fp32 logits the cross entropy keeps.
double embeddingActivationBytes(const ModelSpec &model, int64_t microBatch, int64_t tp,
                                bool sequenceParallel) {
  double mask = double(model.seq) * double(microBatch) * double(model.hidden);
  return sequenceParallel ? mask / double(tp) : mask;
}

double outputActivationBytes(const ModelSpec &model, int64_t paddedVocab, int64_t microBatch,
                             int64_t tp, bool sequenceParallel) {
  const double sb = double(model.seq) * double(microBatch), t = double(tp);
  double inputs = 2 * double(bytesPerElement(model.dtype)) * sb * double(model.hidden);
  if (sequenceParallel)
    inputs /= t;
  return inputs + 4 * sb * double(paddedVocab) / t;
}
} // namespace

MemoryEstimate estimateMemory(const Program &program, const Mapping &mapping) {
  const ModelSpec &model = program.model;
  const ParallelSpec &par = program.parallel;
  const int64_t tp = mapping.tp, pp = mapping.pp, dp = mapping.dp;
  const int64_t mb = mapping.microBatch;
  const StateBytesPerParam perParam = stateBytesPerParam(program);
  const int zero = par.zero;

  MemoryEstimate est;
  est.gpuMemory = program.cluster.gpuMemory;
  for (int64_t stage = 0; stage < pp; ++stage) {
    StageMemory m;
    m.stage = stage;
    std::vector<int64_t> inFlight =
        microbatchesInFlight(par.schedule, pp, stage, mapping.microbatches, mapping.chunks);
    int64_t params = 0, largestLayer = 0;
    double transient = 0;
    auto addLayer = [&](const ParamCount &p) {
      params += p.perRank(tp);
      largestLayer = std::max(largestLayer, p.perRank(tp));
    };

    for (int64_t chunk = 0; chunk < mapping.chunks; ++chunk) {
      auto [first, last] = mapping.partition.range(stage, chunk);
      double chunkActivations = 0;
      for (int64_t i = first; i < last; ++i) {
        const LayerGroup &block = model.blockGroup(i);
        addLayer(blockParams(model, block));
        double kept =
            blockActivationBytes(model, block, mb, tp, par.recompute, par.sequenceParallel);
        chunkActivations += kept;
        // Recompute rematerialises one block's full activations during its backward.
        double full =
            blockActivationBytes(model, block, mb, tp, Recompute::None, par.sequenceParallel);
        transient = std::max(transient, full - kept);
      }
      m.blocks += last - first;
      m.activations += double(inFlight[size_t(chunk)]) * chunkActivations;
      m.inFlight += inFlight[size_t(chunk)];
    }
    m.activations += transient;

    if (stage == 0) {
      addLayer(embeddingParams(model, mapping.paddedVocab));
      m.activations +=
          double(inFlight.front()) * embeddingActivationBytes(model, mb, tp, par.sequenceParallel);
    }
    if (stage == pp - 1) {
      addLayer(finalNormParams(model));
      // A tied head reuses the embedding's matrix only when both live on the same stage;
      // otherwise the last stage keeps a copy, synchronised over the embedding group.
      if (!model.tiedHead() || pp > 1)
        addLayer(headParams(model, mapping.paddedVocab));
      m.activations +=
          double(inFlight.back()) *
          outputActivationBytes(model, mapping.paddedVocab, mb, tp, par.sequenceParallel);
    }

    m.paramsPerRank = params;
    const double n = double(params), shards = double(dp);
    m.weights = n * perParam.weight / (zero >= 3 ? shards : 1);
    m.grads = n * perParam.grad / (zero >= 2 ? shards : 1);
    m.optimizer = n * perParam.optimizer / (zero >= 1 ? shards : 1);
    if (zero >= 3 && dp > 1)
      m.gathered = double(largestLayer) * perParam.weight;
    m.reserve = double(program.cluster.gpuReserve);
    est.stages.push_back(m);
  }
  return est;
}

} // namespace parc
