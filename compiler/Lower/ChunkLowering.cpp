//===- ChunkLowering.cpp - The op lists of one virtual pipeline stage -----===//
//
// Megatron-LM's transformer as explicit ops over named tensors. Tensor-parallel collectives
// sit where Megatron's mappings put them: a row-parallel layer's output is all-reduced over
// tp in the forward, a column-parallel layer's input gradient in the backward. Sequence
// parallelism turns the first into a reduce-scatter along the sequence and adds an
// all-gather before each column-parallel layer, with the conjugates in the backward.
//
// Naming: forward tensors are named after what computes them ("block.3.attn.q"); the
// gradient of tensor x is x.grad, and the parts of a gradient that is summed from several
// paths get a further suffix (".skip", ".norm", ".q"). Recomputed activations carry ".re".
// The conjugate of an all-reduce is the identity, so such a reduction's input and output
// share one gradient tensor: the backward reads the output's gradient.
//
//===----------------------------------------------------------------------===//
#include "ChunkLowerer.h"

#include <algorithm>

namespace parc::lower {

std::string ChunkLowerer::normForward(const std::string &x, const std::string &prefix,
                                      llvm::StringRef sfx, std::string *normOut) {
  std::string y = activation(prefix + sfx.str(), job.seqRows(), job.hidden);
  if (normOut)
    *normOut = y;
  if (job.program.model.norm == Norm::LayerNorm)
    emit(OpKind::LayerNorm, {x, param(prefix, "weight"), param(prefix, "bias")}, {y}, normAttrs());
  else
    emit(OpKind::RMSNorm, {x, param(prefix, "weight")}, {y}, normAttrs());
  if (!job.sequenceParallel)
    return y;
  std::string full = activation(prefix + ".full" + sfx.str(), job.seq, job.hidden);
  emit(OpKind::AllGather, {y}, {full}, groupDimAttrs(plan::Group::TP, 0));
  return full;
}

std::string ChunkLowerer::regathered(const std::string &normOut, const std::string &gathered,
                                     bool recomputed) {
  // A full recompute gathered it within the backward already.
  if (!job.sequenceParallel || normOut == gathered || recomputed)
    return gathered;
  std::string again = activation(gathered + ".re", job.seq, job.hidden);
  emit(OpKind::AllGather, {normOut}, {again}, groupDimAttrs(plan::Group::TP, 0));
  return again;
}

void ChunkLowerer::normBackward(const std::string &x, const std::string &prefix,
                                const std::string &dy, const std::string &dx) {
  std::string dWeight = plan::gradName(param(prefix, "weight"));
  if (job.program.model.norm == Norm::LayerNorm)
    emit(OpKind::LayerNormBwd, {x, param(prefix, "weight"), dy},
         {dx, dWeight, plan::gradName(param(prefix, "bias"))}, normAttrs());
  else
    emit(OpKind::RMSNormBwd, {x, param(prefix, "weight"), dy}, {dx, dWeight}, normAttrs());
}

std::string ChunkLowerer::columnInputGrad(const std::string &normOut) {
  std::string grad = plan::gradName(normOut);
  return declare(job.tp > 1 ? grad + ".partial" : grad, {job.seq, job.microBatch, job.hidden},
                 job.dtype);
}

void ChunkLowerer::reduceColumnInputGrad(const std::string &normOut) {
  if (job.tp == 1)
    return;
  std::string partial = plan::gradName(normOut) + ".partial";
  if (job.sequenceParallel)
    emit(OpKind::ReduceScatter, {partial}, {gradOf(normOut)}, groupDimAttrs(plan::Group::TP, 0));
  else
    emit(OpKind::AllReduce, {partial}, {gradOf(normOut)}, groupAttrs(plan::Group::TP));
}

std::string ChunkLowerer::columnForward(const std::string &input, const std::string &prefix,
                                        int64_t width, bool bias, llvm::StringRef sfx) {
  std::string product = activation(prefix + (bias ? ".mm" : "") + sfx.str(), job.seq, width);
  emit(OpKind::MatMul, {input, param(prefix, "weight")}, {product}, linearAttrs);
  if (!bias)
    return product;
  std::string y = activation(prefix + sfx.str(), job.seq, width);
  emit(OpKind::BiasAdd, {product, param(prefix, "bias")}, {y});
  return y;
}

void ChunkLowerer::columnBackward(const std::string &input, const std::string &prefix,
                                  const std::string &dInput, const std::string &dWeight,
                                  const std::string &dBias) {
  std::string dy = plan::gradName(prefix);
  if (!dBias.empty()) {
    std::string dProduct = gradOf(prefix + ".mm");
    emit(OpKind::BiasAddBwd, {dy}, {dProduct, dBias});
    dy = dProduct;
  }
  emit(OpKind::MatMulBwd, {input, param(prefix, "weight"), dy}, {dInput, dWeight}, linearAttrs);
}

RowNames ChunkLowerer::rowNames(const std::string &prefix, llvm::StringRef sfx) const {
  RowNames names;
  names.out = prefix + sfx.str();
  names.reduced = job.biases ? prefix + ".sum" + sfx.str() : names.out;
  names.product = job.tp > 1 ? prefix + ".partial" + sfx.str() : names.reduced;
  return names;
}

std::string ChunkLowerer::rowForward(const std::string &input, const std::string &prefix,
                                     llvm::StringRef sfx) {
  RowNames names = rowNames(prefix, sfx);
  activation(names.product, job.seq, job.hidden);
  emit(OpKind::MatMul, {input, param(prefix, "weight")}, {names.product}, linearAttrs);
  if (job.tp > 1) {
    activation(names.reduced, job.seqRows(), job.hidden);
    if (job.sequenceParallel)
      emit(OpKind::ReduceScatter, {names.product}, {names.reduced},
           groupDimAttrs(plan::Group::TP, 0));
    else
      emit(OpKind::AllReduce, {names.product}, {names.reduced}, groupAttrs(plan::Group::TP));
  }
  if (job.biases) {
    activation(names.out, job.seqRows(), job.hidden);
    emit(OpKind::BiasAdd, {names.reduced, param(prefix, "bias")}, {names.out});
  }
  return names.out;
}

std::string ChunkLowerer::rowBackward(const std::string &input, const std::string &inputName,
                                      const std::string &prefix) {
  RowNames names = rowNames(prefix, "");
  std::string dy = plan::gradName(names.out);
  if (job.biases) {
    std::string dReduced = gradOf(names.reduced);
    emit(OpKind::BiasAddBwd, {dy}, {dReduced, plan::gradName(param(prefix, "bias"))});
    dy = dReduced;
  }
  if (job.tp > 1 && job.sequenceParallel) {
    std::string dProduct = gradOf(names.product);
    emit(OpKind::AllGather, {dy}, {dProduct}, groupDimAttrs(plan::Group::TP, 0));
    dy = dProduct;
  }
  std::string dInput = gradOf(inputName);
  emit(OpKind::MatMulBwd, {input, param(prefix, "weight"), dy},
       {dInput, plan::gradName(param(prefix, "weight"))}, linearAttrs);
  return dInput;
}

std::string ChunkLowerer::sharedGradTarget(const std::string &param, const Shape &shape,
                                           const BlockDims &dims) {
  if (dims.kvReplicas == 1)
    return plan::gradName(param);
  return declare(param + ".grad.local", shape, job.gradDtype);
}

void ChunkLowerer::sumSharedGrad(const std::string &param, const Shape &shape,
                                 const BlockDims &dims) {
  if (dims.kvReplicas == 1)
    return;
  Shape gathered = shape;
  gathered[0] *= job.tp;
  declare(param + ".grad.gathered", gathered, job.gradDtype);
  emit(OpKind::AllGather, {param + ".grad.local"}, {param + ".grad.gathered"},
       groupDimAttrs(plan::Group::TP, 0));
  std::vector<std::string> parts;
  for (int64_t r = 0; r < job.tp; ++r)
    parts.push_back(declare(param + ".grad.part" + std::to_string(r), shape, job.gradDtype));
  emit(OpKind::Split, {param + ".grad.gathered"}, parts, {{"dim", int64_t(0)}});
  // The ranks sharing this head are consecutive tp ranks.
  int64_t first = tpRank / dims.kvReplicas * dims.kvReplicas;
  std::string sum = parts[first];
  for (int64_t i = 1; i < dims.kvReplicas; ++i) {
    std::string next = i + 1 == dims.kvReplicas
                           ? plan::gradName(param)
                           : declare(param + ".grad.sum" + std::to_string(i), shape, job.gradDtype);
    emit(OpKind::ResidualAdd, {sum, parts[first + i]}, {next});
    sum = next;
  }
}

//===----------------------------------------------------------------------===//
// Embedding and head
//===----------------------------------------------------------------------===//

std::string ChunkLowerer::embeddingForward() {
  declare("tokens", {job.microBatch, job.seq}, plan::DType::Int64);
  bool learned = job.program.model.position == Position::Learned;
  std::string out = "embedding.out";
  // Each tp rank looks up the ids in its rows of the table; the sum over tp completes it.
  std::string lookup = job.tp > 1 ? "embedding.word.partial" : learned ? "embedding.word" : out;
  activation(lookup, job.seq, job.hidden);
  emit(OpKind::Embedding, {"tokens", WordEmbedding.str()}, {lookup},
       {{"vocab_offset", vocabOffset()}});
  if (!learned) {
    if (job.tp == 1)
      return out;
    activation(out, job.seqRows(), job.hidden);
    if (job.sequenceParallel)
      emit(OpKind::ReduceScatter, {lookup}, {out}, groupDimAttrs(plan::Group::TP, 0));
    else
      emit(OpKind::AllReduce, {lookup}, {out}, groupAttrs(plan::Group::TP));
    return out;
  }
  // Positions index the whole sequence, so under sequence parallelism they are added before
  // the sequence is split (Megatron-LM all-reduces, then scatters, in this case too).
  std::string word = "embedding.word";
  if (job.tp > 1) {
    activation(word, job.seq, job.hidden);
    emit(OpKind::AllReduce, {lookup}, {word}, groupAttrs(plan::Group::TP));
  }
  std::string positioned = job.sequenceParallel ? "embedding.position" : out;
  activation(positioned, job.seq, job.hidden);
  if (job.cp > 1)
    addChunkPositions(writer, cpRank, word, positioned);
  else
    emit(OpKind::PositionEmbedding, {word, PositionEmbedding.str()}, {positioned},
         {{"offset", int64_t(0)}});
  if (!job.sequenceParallel)
    return out;
  std::vector<std::string> parts;
  for (int64_t r = 0; r < job.tp; ++r)
    parts.push_back(activation(r == tpRank ? out : "embedding.position.part" + std::to_string(r),
                               job.seqRows(), job.hidden));
  emit(OpKind::Split, {positioned}, parts, {{"dim", int64_t(0)}});
  return out;
}

void ChunkLowerer::embeddingBackward() {
  bool learned = job.program.model.position == Position::Learned;
  std::string out = "embedding.out";
  std::string dy = plan::gradName(out);
  std::string gathered = learned ? "embedding.position" : "embedding.word.partial";
  if (job.sequenceParallel) {
    // The conjugate of the split (or reduce-scatter) along the sequence.
    std::string dGathered = gradOf(gathered);
    emit(OpKind::AllGather, {dy}, {dGathered}, groupDimAttrs(plan::Group::TP, 0));
    dy = dGathered;
  }
  if (learned) {
    std::string dWord = gradOf("embedding.word");
    if (job.cp > 1)
      addChunkPositionsBackward(writer, cpRank, dy, dWord);
    else
      emit(OpKind::PositionEmbeddingBwd, {dy}, {dWord, plan::gradName(PositionEmbedding)},
           {{"offset", int64_t(0)}});
    dy = dWord;
  }
  emit(OpKind::EmbeddingBwd, {"tokens", dy}, {plan::gradName(WordEmbedding)},
       {{"vocab_offset", vocabOffset()}});
}

void ChunkLowerer::headForward(const std::string &y) {
  headInput = normForward(y, "final_norm", "", &headNorm);
  // Megatron computes the cross entropy in fp32; the logits are kept that way.
  declare("logits", {job.seq, job.microBatch, job.paddedVocab / job.tp}, plan::DType::FP32);
  emit(OpKind::MatMul, {headInput, headWeight()}, {"logits"}, linearAttrs);
  declare("labels", {job.microBatch, job.seq}, plan::DType::Int64);
  declare("loss", {}, plan::DType::FP32);
  declare("loss.grad", {}, plan::DType::FP32);
  emit(OpKind::CrossEntropy, {"logits", "labels"}, {"loss"}, lossAttrs());
}

void ChunkLowerer::headBackward(const std::string &y) {
  emit(OpKind::CrossEntropyBwd, {"logits", "labels", "loss.grad"}, {gradOf("logits")}, lossAttrs());
  emit(OpKind::MatMulBwd, {regathered(headNorm, headInput), headWeight(), "logits.grad"},
       {columnInputGrad("final_norm"), plan::gradName(headWeight())}, linearAttrs);
  reduceColumnInputGrad("final_norm");
  normBackward(y, "final_norm", plan::gradName("final_norm"), gradOf(y));
}

//===----------------------------------------------------------------------===//
// Transformer blocks
//===----------------------------------------------------------------------===//

BlockActivations ChunkLowerer::blockForward(int64_t block, const std::string &x,
                                            llvm::StringRef sfx, bool forRecompute) {
  BlockDims dims(job, block, tpRank);
  auto name = [&](llvm::StringRef leaf) { return blockName(block, leaf) + sfx.str(); };
  int64_t d = dims.headDim, qWidth = dims.localHeads * d, kvWidth = dims.localKvHeads * d;
  BlockActivations a;
  a.recomputed = forRecompute;
  a.qkvInput = normForward(x, blockName(block, "ln1"), sfx, &a.qkvNorm);
  a.q = columnForward(a.qkvInput, blockName(block, "attn.q"), qWidth, job.qkvBias, sfx);
  a.k = columnForward(a.qkvInput, blockName(block, "attn.k"), kvWidth, job.qkvBias, sfx);
  a.v = columnForward(a.qkvInput, blockName(block, "attn.v"), kvWidth, job.qkvBias, sfx);
  if (job.cp > 1) {
    a.ring = ringAttentionForward(writer, ringSite(block, dims), a.q, a.k, a.v, sfx);
    a.context = a.ring.output;
  } else {
    if (job.program.model.position == Position::RoPE) {
      std::string q = activation(name("attn.q.rope"), job.seq, qWidth);
      emit(OpKind::RoPE, {a.q}, {q}, ropeAttrs(dims.localHeads));
      std::string k = activation(name("attn.k.rope"), job.seq, kvWidth);
      emit(OpKind::RoPE, {a.k}, {k}, ropeAttrs(dims.localKvHeads));
      a.q = q;
      a.k = k;
    }
    a.context = activation(name("attn.ctx"), job.seq, qWidth);
    a.stats = attentionStats(name("attn.stats"), dims);
    emit(OpKind::Attention, {a.q, a.k, a.v}, {a.context, a.stats}, attentionAttrs(dims));
  }
  std::string attnOut = rowForward(a.context, blockName(block, "attn.proj"), sfx);
  a.residual = activation(name("res1"), job.seqRows(), job.hidden);
  emit(OpKind::ResidualAdd, {x, attnOut}, {a.residual});
  a.mlpInput = normForward(a.residual, blockName(block, "ln2"), sfx, &a.mlpNorm);
  std::string mlpOut;
  if (dims.moe.enabled()) {
    mlpOut = moeForward(block, dims, a, sfx, forRecompute);
  } else {
    bool swiglu = dims.mlp == MLPKind::SwiGLU;
    if (swiglu)
      a.mlpGate =
          columnForward(a.mlpInput, blockName(block, "mlp.gate"), dims.localFfn, job.biases, sfx);
    a.mlpHidden =
        columnForward(a.mlpInput, blockName(block, "mlp.up"), dims.localFfn, job.biases, sfx);
    a.mlpActivated = activation(name("mlp.act"), job.seq, dims.localFfn);
    if (swiglu)
      emit(OpKind::SwiGLU, {a.mlpGate, a.mlpHidden}, {a.mlpActivated});
    else
      emit(OpKind::GELU, {a.mlpHidden}, {a.mlpActivated});
    // No backward op reads the down projection's output or the block's, so a recompute stops
    // at the activation function.
    if (!forRecompute)
      mlpOut = rowForward(a.mlpActivated, blockName(block, "mlp.down"), sfx);
  }
  if (forRecompute)
    return a;
  emit(OpKind::ResidualAdd, {a.residual, mlpOut},
       {activation(name("out"), job.seqRows(), job.hidden)});
  return a;
}

void ChunkLowerer::denseMLPBackward(int64_t block, const BlockDims &dims,
                                    const BlockActivations &saved) {
  auto name = [&](llvm::StringRef leaf) { return blockName(block, leaf); };
  std::string dActivated = rowBackward(saved.mlpActivated, name("mlp.act"), name("mlp.down"));
  std::string mlpInput;
  auto mlpColumnBackward = [&](llvm::StringRef layer, const std::string &dInput) {
    std::string prefix = name(layer);
    columnBackward(mlpInput, prefix, dInput, plan::gradName(prefix + ".weight"),
                   job.biases ? plan::gradName(prefix + ".bias") : "");
  };
  if (dims.mlp == MLPKind::SwiGLU) {
    emit(OpKind::SwiGLUBwd, {saved.mlpGate, saved.mlpHidden, dActivated},
         {gradOf(name("mlp.gate")), gradOf(name("mlp.up"))});
    mlpInput = regathered(saved.mlpNorm, saved.mlpInput, saved.recomputed);
    // gate and up each contribute a partial gradient of ln2; they add up before the reduction.
    std::string dMlpInput = columnInputGrad(name("ln2"));
    auto inputPart = [&](llvm::StringRef part) {
      return declare(dMlpInput + "." + part.str(), {job.seq, job.microBatch, job.hidden},
                     job.dtype);
    };
    mlpColumnBackward("mlp.gate", inputPart("gate"));
    mlpColumnBackward("mlp.up", inputPart("up"));
    emit(OpKind::ResidualAdd, {dMlpInput + ".gate", dMlpInput + ".up"}, {dMlpInput});
  } else {
    emit(OpKind::GELUBwd, {saved.mlpHidden, dActivated}, {gradOf(name("mlp.up"))});
    mlpInput = regathered(saved.mlpNorm, saved.mlpInput, saved.recomputed);
    mlpColumnBackward("mlp.up", columnInputGrad(name("ln2")));
  }
  reduceColumnInputGrad(name("ln2"));
}

void ChunkLowerer::blockBackward(int64_t block, const std::string &x,
                                 const BlockActivations &saved) {
  BlockDims dims(job, block, tpRank);
  auto name = [&](llvm::StringRef leaf) { return blockName(block, leaf); };
  auto partOf = [&](const std::string &grad, llvm::StringRef part) {
    return activation(grad + "." + part.str(), job.seqRows(), job.hidden);
  };
  bool rope = job.program.model.position == Position::RoPE;

  // MLP half: out = res1 + mlp(ln2(res1)).
  std::string dResidual = plan::gradName(name("res1"));
  std::string mlpOut = mlpOutputName(block, dims);
  emit(OpKind::ResidualAddBwd, {plan::gradName(name("out"))},
       {partOf(dResidual, "skip"), gradOf(mlpOut)});
  if (dims.moe.enabled())
    moeBackward(block, dims, saved, plan::gradName(mlpOut));
  else
    denseMLPBackward(block, dims, saved);
  normBackward(saved.residual, name("ln2"), plan::gradName(name("ln2")), partOf(dResidual, "norm"));
  emit(OpKind::ResidualAdd, {dResidual + ".skip", dResidual + ".norm"}, {gradOf(name("res1"))});

  // Attention half: res1 = x + proj(attention(q, k, v)).
  std::string dInput = plan::gradName(name("in"));
  emit(OpKind::ResidualAddBwd, {dResidual}, {partOf(dInput, "skip"), gradOf(name("attn.proj"))});
  if (job.cp > 1) {
    // Selective recompute reruns the ring from its saved chunks.
    RingSite site = ringSite(block, dims);
    RingAttention ring = job.recompute == Recompute::Selective
                             ? ringAttentionRecompute(writer, site, saved.ring, ".re")
                             : saved.ring;
    std::string dContext = rowBackward(ring.output, saved.ring.output, name("attn.proj"));
    ringAttentionBackward(writer, site, ring, dContext, gradOf(name("attn.q")),
                          gradOf(name("attn.k")), gradOf(name("attn.v")));
  } else {
    std::string context = saved.context, stats = saved.stats;
    if (job.recompute == Recompute::Selective) {
      // Selective recompute: the attention core is rerun from its saved inputs.
      context = activation(name("attn.ctx.re"), job.seq, dims.localHeads * dims.headDim);
      stats = attentionStats(name("attn.stats.re"), dims);
      emit(OpKind::Attention, {saved.q, saved.k, saved.v}, {context, stats}, attentionAttrs(dims));
    }
    std::string dContext = rowBackward(context, name("attn.ctx"), name("attn.proj"));
    std::string qName = name(rope ? "attn.q.rope" : "attn.q");
    std::string kName = name(rope ? "attn.k.rope" : "attn.k");
    emit(OpKind::AttentionBwd, {saved.q, saved.k, saved.v, context, stats, dContext},
         {gradOf(qName), gradOf(kName), gradOf(name("attn.v"))}, attentionAttrs(dims));
    if (rope) {
      emit(OpKind::RoPEBwd, {plan::gradName(qName)}, {gradOf(name("attn.q"))},
           ropeAttrs(dims.localHeads));
      emit(OpKind::RoPEBwd, {plan::gradName(kName)}, {gradOf(name("attn.k"))},
           ropeAttrs(dims.localKvHeads));
    }
  }
  // q, k and v each contribute a partial gradient of ln1; they add up before the reduction.
  std::string dQkvInput = columnInputGrad(name("ln1"));
  auto inputPart = [&](llvm::StringRef part) {
    return declare(dQkvInput + "." + part.str(), {job.seq, job.microBatch, job.hidden}, job.dtype);
  };
  std::string qkvInput = regathered(saved.qkvNorm, saved.qkvInput, saved.recomputed);
  columnBackward(qkvInput, name("attn.q"), inputPart("q"),
                 plan::gradName(name("attn.q.weight")),
                 job.qkvBias ? plan::gradName(name("attn.q.bias")) : "");
  Shape weightShape = {dims.localKvHeads * dims.headDim, job.hidden};
  Shape biasShape = {dims.localKvHeads * dims.headDim};
  for (llvm::StringRef kv : {"k", "v"}) {
    std::string prefix = name("attn." + kv.str());
    std::string weight = prefix + ".weight", bias = prefix + ".bias";
    columnBackward(qkvInput, prefix, inputPart(kv),
                   sharedGradTarget(weight, weightShape, dims),
                   job.qkvBias ? sharedGradTarget(bias, biasShape, dims) : "");
    sumSharedGrad(weight, weightShape, dims);
    if (job.qkvBias)
      sumSharedGrad(bias, biasShape, dims);
  }
  emit(OpKind::ResidualAdd, {dQkvInput + ".q", dQkvInput + ".k"}, {inputPart("qk")});
  emit(OpKind::ResidualAdd, {dQkvInput + ".qk", dQkvInput + ".v"}, {dQkvInput});
  reduceColumnInputGrad(name("ln1"));
  normBackward(x, name("ln1"), plan::gradName(name("ln1")), partOf(dInput, "norm"));
  emit(OpKind::ResidualAdd, {dInput + ".skip", dInput + ".norm"}, {gradOf(x)});
}

namespace {
/// ZeroPolicy.h's units of `params` (in chunk order), listed as the backward finishes them.
std::vector<LoweredUnit> groupUnits(const std::vector<plan::ParamShard> &params) {
  std::vector<LoweredUnit> units;
  for (const plan::ParamShard &shard : params) {
    llvm::StringRef name = shard.name;
    ParamUnit unit;
    if (name == WordEmbedding)
      unit.kind = ParamUnitKind::WordEmbedding;
    else if (name == PositionEmbedding)
      unit.kind = ParamUnitKind::PositionEmbedding;
    else if (name == HeadWeight)
      unit.kind = ParamUnitKind::Head;
    else if (name.startswith("final_norm."))
      unit.kind = ParamUnitKind::FinalNorm;
    else if (!name.consume_front("block.") || name.consumeInteger(10, unit.block))
      llvm_unreachable("a parameter outside every ZeRO unit");
    else if (isExpertParam(shard.name))
      unit.kind = ParamUnitKind::Experts;
    else
      unit.kind = name.startswith(".ln1.") || name.startswith(".attn.") ? ParamUnitKind::Attention
                                                                         : ParamUnitKind::MLP;
    // The tied embedding's copy beside the head is the last stage's head unit.
    if (unit.kind == ParamUnitKind::WordEmbedding && !units.empty())
      unit.kind = ParamUnitKind::Head;
    if (units.empty() || units.back().unit.kind != unit.kind || units.back().unit.block != unit.block)
      units.push_back({unit, {}});
    units.back().params.push_back(shard.name);
    int64_t numel = 1;
    for (int64_t dim : shard.localShape())
      numel *= dim;
    units.back().unit.elements += numel;
  }
  std::reverse(units.begin(), units.end());
  return units;
}

} // namespace

LoweredChunk ChunkLowerer::run() {
  plan::Chunk &chunk = result.chunk;
  auto [first, last] = job.blocksOf(virtualStage);
  chunk.index = virtualStage / job.pp;
  chunk.virtualStage = virtualStage;
  chunk.firstBlock = first;
  chunk.lastBlock = last - 1;
  chunk.hasEmbedding = virtualStage == 0;
  chunk.hasHead = virtualStage + 1 == job.virtualStages();
  chunk.input = chunk.hasEmbedding ? "" : job.outputOf(virtualStage - 1);
  chunk.output = chunk.hasHead ? "" : job.outputOf(virtualStage);

  std::vector<plan::ParamShard> &params = result.params;
  if (chunk.hasEmbedding)
    addEmbeddingParams(job, tpRank, params);
  for (int64_t block = first; block < last; ++block)
    addBlockParams(job, block, tpRank, params);
  if (chunk.hasHead)
    addHeadParams(job, tpRank, chunk.hasEmbedding, params);
  result.units = groupUnits(params);
  // Under sequence parallelism norms and row-parallel biases see only this rank's part of the
  // sequence; positions are added to the whole sequence, and a router reads the gathered
  // sequence with its whole gradient, so their gradients are complete.
  if (job.sequenceParallel)
    for (const plan::ParamShard &shard : params)
      if (shard.kind == plan::ShardKind::Replicated && shard.name != PositionEmbedding &&
          !llvm::StringRef(shard.name).endswith(".moe.router.weight"))
        result.tpPartialGrads.push_back(shard.name);

  writer.ops = &chunk.forward;
  std::string x;
  if (chunk.hasEmbedding) {
    x = embeddingForward();
  } else {
    x = activation(chunk.input, job.seqRows(), job.hidden);
    gradOf(chunk.input);
  }
  std::string chunkInput = x;
  std::vector<BlockActivations> saved;
  for (int64_t block = first; block < last; ++block) {
    saved.push_back(blockForward(block, x, "", /*forRecompute=*/false));
    x = blockName(block, "out");
  }
  if (chunk.hasHead)
    headForward(x);
  else
    gradOf(chunk.output);

  writer.ops = &chunk.backward;
  if (chunk.hasHead)
    headBackward(x);
  for (int64_t block = last - 1; block >= first; --block) {
    std::string blockInput = block == first ? chunkInput : blockName(block - 1, "out");
    BlockActivations activations = saved[block - first];
    // Full recompute keeps only the block's input and reruns its forward here.
    if (job.recompute == Recompute::Full)
      activations = blockForward(block, blockInput, ".re", /*forRecompute=*/true);
    blockBackward(block, blockInput, activations);
  }
  if (chunk.hasEmbedding)
    embeddingBackward();
  return std::move(result);
}

LoweredChunk lowerChunk(const Job &job, int64_t virtualStage, int64_t tpRank, int64_t cpRank) {
  return ChunkLowerer(job, virtualStage, tpRank, cpRank).run();
}

} // namespace parc::lower
