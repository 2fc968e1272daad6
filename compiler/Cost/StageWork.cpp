//===- StageWork.cpp - What each pipeline stage does in one step ----------===//
//
// The ops of a block follow Megatron-LM's transformer layer (and the lowering): norm, q/k/v
// projection (column-parallel), attention core, output projection (row-parallel), the
// tensor-parallel reduction, bias-dropout-add, norm, MLP up (and gate), activation, MLP down,
// reduction, bias-dropout-add. Shapes are per tensor-parallel rank; T = micro_batch x seq
// tokens, of which a sequence-parallel rank holds T / tp outside the GEMMs.
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/StageWork.h"
#include "parc/Cost/CostModel.h"
#include "parc/Cost/GPUModel.h"
#include "parc/Cost/MemoryModel.h"

#include <algorithm>

namespace parc {

PassTime &PassTime::operator+=(const PassTime &o) {
  gemm += o.gemm;
  attention += o.attention;
  memory += o.memory;
  tp += o.tp;
  zero += o.zero;
  cp += o.cp;
  ep += o.ep;
  return *this;
}

PassTime PassTime::scaled(double k) const {
  PassTime p = *this;
  p.gemm *= k;
  p.attention *= k;
  p.memory *= k;
  p.tp *= k;
  p.zero *= k;
  p.cp *= k;
  p.ep *= k;
  return p;
}

std::vector<const VirtualStageWork *> WorkTable::chunksOf(int64_t stage) const {
  std::vector<const VirtualStageWork *> out;
  for (size_t v = size_t(stage); v < virtualStages.size(); v += size_t(stageCount))
    out.push_back(&virtualStages[v]);
  return out;
}

double optimizerBytesPerParam(const Program &program) {
  const bool mixed = program.model.dtype != DType::FP32;
  const double grad = double(bytesPerElement(program.train.gradDtype));
  // Norm over the gradients, then their scaling by the clip factor.
  double bytes = grad + (program.train.gradClip > 0 ? 2 * grad : 0);
  // The update reads the gradient and reads and writes the fp32 weights and each moment.
  int moments = program.train.optimizer == Optimizer::Adam ? 2
                : program.train.momentum != 0             ? 1
                                                          : 0;
  bytes += grad + 8 + 8 * moments;
  // Mixed precision copies the fp32 master weights back to the model's dtype.
  if (mixed)
    bytes += 4 + double(bytesPerElement(program.model.dtype));
  return bytes;
}

namespace {

/// The passes of one transformer block, and of the part selective recompute repeats.
struct BlockPasses {
  PassTime forward, backward, attentionCore;
};

/// Everything the per-op formulas need, derived once per mapping.
struct WorkContext {
  const Program &program;
  const Mapping &mapping;
  GPUModel gpu;
  CommModel comm;
  GroupGeometry tpGroup, epGroup;
  double tokens, seq, tp, cp, e;
  bool sp, ringCrossesNodes;

  /// With context parallelism a rank holds micro_batch x seq / cp of the tokens.
  WorkContext(const Program &program, const Mapping &mapping)
      : program(program), mapping(mapping), gpu(program.cluster, program.model.dtype),
        comm(program.cluster), tpGroup(geometryOf(mapping.layout, Axis::TP)),
        epGroup(expertGeometry(mapping.layout, false)),
        tokens(double(mapping.microBatch) * double(program.model.seq) / double(mapping.cp)),
        seq(double(program.model.seq)), tp(double(mapping.tp)), cp(double(mapping.cp)),
        e(double(bytesPerElement(program.model.dtype))),
        sp(program.parallel.sequenceParallel && mapping.tp > 1),
        ringCrossesNodes(mapping.layout.anyGroupCrossesNodes(Axis::CP)) {}

  /// Tokens a rank holds outside the tensor-parallel GEMMs.
  double localTokens() const { return sp ? tokens / tp : tokens; }
  /// One reduction of the activations between the row-parallel GEMM and the next norm:
  /// an all-reduce, or with sequence parallelism a reduce-scatter now and an all-gather
  /// before the next column-parallel GEMM (the same ring volume).
  double activationReduction() const {
    double bytes = e * tokens * double(program.model.hidden);
    if (sp)
      return comm.reduceScatter(bytes, tpGroup) + comm.allGather(bytes, tpGroup);
    return comm.allReduce(bytes, tpGroup);
  }
  /// A GEMM of the forward, m x n x k, with its two backward GEMMs: the input gradient
  /// (m x k x n) and the weight gradient (k x n x m).
  void linear(double m, double n, double k, BlockPasses &p) const {
    p.forward.gemm += gpu.gemmSeconds(m, n, k);
    p.backward.gemm += gpu.gemmSeconds(m, k, n) + gpu.gemmSeconds(k, n, m);
  }
  /// A memory-bound kernel moving `bytes` forward; its backward moves about twice as much
  /// (the incoming gradient and the saved input in, the input gradient out).
  void elementwise(double bytes, double kernels, BlockPasses &p) const {
    p.forward.memory += gpu.memorySeconds(bytes, kernels);
    p.backward.memory += gpu.memorySeconds(2 * bytes, 2 * kernels);
  }
  /// Tensor-parallel collectives overlap the pass's GEMMs only with tp_comm_overlap.
  double exposedTP(double seconds, double gemm) const {
    return program.parallel.tpCommOverlap ? std::max(0.0, seconds - gemm) : seconds;
  }
};

/// Ring attention (cp > 1): cp steps of one block each, step i's key/value exchange behind
/// step i - 1's block (Transformer Engine's schedule). The forward sends the keys and values
/// cp - 1 times; the backward sends them again with the accumulating dK/dV, whose last hop,
/// home to their owner, follows the last block. What a step's block cannot hide shows, and
/// the hidden part slows the block as any overlapped collective does.
void ringExchange(const WorkContext &c, double kvBytes, double forwardStep, double backwardStep,
                  BlockPasses &p) {
  if (c.cp <= 1)
    return;
  auto exposed = [](double comm, double compute) {
    return CommModel::exposedBeside(comm, compute);
  };
  const double kv = c.comm.send(kvBytes, c.ringCrossesNodes);
  const double kvAndGrad = c.comm.send(2 * kvBytes, c.ringCrossesNodes);
  p.attentionCore.cp += (c.cp - 1) * exposed(kv, forwardStep);
  p.backward.cp += (c.cp - 1) * exposed(kvAndGrad, backwardStep) + kv;
}

/// The key/value width of one tp rank: the heads split over tp, or one whole head per rank
/// when there are fewer.
double keyValueWidth(const WorkContext &c, const ModelSpec &model, const LayerGroup &block) {
  const double d = double(headDim(model, block));
  return block.kvHeads >= c.mapping.tp ? double(block.kvHeads) * d / c.tp : d;
}

void attentionCore(const WorkContext &c, const ModelSpec &model, const LayerGroup &block,
                   BlockPasses &p) {
  const double b = double(c.mapping.microBatch), s = c.seq, e = c.e;
  const double d = double(headDim(model, block));
  const double heads = double(block.heads) / c.tp; // query heads on one rank
  const double kvRank = keyValueWidth(c, model, block);
  // The queries this rank holds; with cp > 1 they meet every key over cp ring steps.
  const double sq = s / c.cp;
  const double kvBytes = 2 * e * sq * b * kvRank;
  if (model.attention == Attention::Flash) {
    // QK^T and PV over the causal half the kernel visits; the backward recomputes the
    // scores and runs five products for the forward's two. Ring attention runs one kernel
    // per step over blocks of seq / cp queries and keys.
    double flops = 2 * 2 * b * heads * s * s * d * 0.5 / c.cp;
    double forwardStep = c.gpu.flashSeconds(flops / c.cp, sq, d, false);
    double backwardStep = c.gpu.flashSeconds(2.5 * flops / c.cp, sq, d, true);
    p.attentionCore.attention += c.cp * forwardStep;
    p.backward.attention += c.cp * backwardStep;
    ringExchange(c, kvBytes, forwardStep, backwardStep, p);
    return;
  }
  // Megatron's unfused core: batched QK^T and PV over the whole s x s (no causal skip), the
  // fused scale-mask-softmax, and dropout on the probabilities; with cp a rank's seq / cp
  // query rows.
  const double batch = b * heads, scores = batch * sq * s;
  double gemm = c.gpu.gemmSeconds(sq, s, d, batch) + c.gpu.gemmSeconds(sq, d, s, batch);
  double backwardGemm = c.gpu.gemmSeconds(sq, d, s, batch) + c.gpu.gemmSeconds(sq, s, d, batch) +
                        c.gpu.gemmSeconds(sq, s, d, batch) + c.gpu.gemmSeconds(d, sq, s, batch);
  double softmax = 2 * e * scores, softmaxBackward = 3 * e * scores;
  double kernels = 1;
  if (model.dropout > 0) {
    softmax += (2 * e + 1) * scores;
    softmaxBackward += (2 * e + 1) * scores;
    kernels = 2;
  }
  p.attentionCore.attention += gemm;
  p.attentionCore.memory += c.gpu.memorySeconds(softmax, kernels);
  p.backward.attention += backwardGemm;
  p.backward.memory += c.gpu.memorySeconds(softmaxBackward, kernels);
  ringExchange(c, kvBytes, (gemm + c.gpu.memorySeconds(softmax, kernels)) / c.cp,
               (backwardGemm + c.gpu.memorySeconds(softmaxBackward, kernels)) / c.cp, p);
}

/// A dense MLP of `f` columns per tp rank over `rows` tokens: up (and gate), the activation,
/// down.
void denseMLP(const WorkContext &c, const LayerGroup &block, double rows, double fRank,
              BlockPasses &p) {
  const double h = double(c.program.model.hidden);
  const bool swiglu = isGated(block.mlp);
  c.linear(rows, (swiglu ? 2 : 1) * fRank, h, p);           // MLP up (and gate)
  c.elementwise((swiglu ? 3 : 2) * c.e * rows * fRank, 1, p); // bias-GeLU or SwiGLU
  c.linear(rows, h, fRank, p);                              // MLP down
}

/// A mixture-of-experts MLP on one rank: the router over all T tokens (replicated over tp),
/// the permutations into and out of the all-to-all buffers, the expert MLPs over the rows the
/// rank receives (T x top_k when the router balances the experts), the shared experts, and
/// the two all-to-alls over the ep group forward (dispatch, combine) and backward.
void expertMLP(const WorkContext &c, const LayerGroup &block, BlockPasses &p) {
  const MoESpec &moe = block.moe;
  const double T = c.tokens, h = double(c.program.model.hidden), e = c.e;
  const double rows = expertRows(moe, T, c.mapping.ep).expected;
  c.linear(T, double(moe.experts), h, p);                  // router logits
  c.elementwise(3 * e * T * double(moe.experts), 1, p);    // softmax, top-k, load statistics
  c.elementwise(4 * e * rows * h, 4, p);                   // permute, unpermute, weighted sum
  denseMLP(c, block, rows, double(moe.ffn) / c.tp, p);
  if (moe.sharedExperts)
    denseMLP(c, block, T, double(moe.sharedFfn()) / c.tp, p);
  double exchange = 2 * c.comm.allToAll(e * rows * h, c.epGroup);
  p.forward.ep += exchange;
  p.backward.ep += exchange;
}

BlockPasses blockPasses(const WorkContext &c, const LayerGroup &block) {
  const ModelSpec &model = c.program.model;
  const double T = c.tokens, local = c.localTokens(), h = double(model.hidden), e = c.e;
  const double d = double(headDim(model, block));
  const double qRank = double(block.heads) * d / c.tp;
  const double kvRank = keyValueWidth(c, model, block);
  const double fRank = double(block.ffn) / c.tp;
  const double mask = model.dropout > 0 ? 1 : 0; // dropout's 1-byte mask per element

  BlockPasses p;
  c.elementwise(2 * e * local * h, 1, p); // input norm
  c.linear(T, qRank + 2 * kvRank, h, p);  // q, k, v
  if (model.position == Position::RoPE)
    c.elementwise(2 * e * T * (qRank + kvRank), 1, p);
  attentionCore(c, model, block, p);
  p.forward += p.attentionCore;
  c.linear(T, h, qRank, p);                           // output projection
  c.elementwise((3 * e + mask) * local * h, 1, p);    // bias, dropout, residual add
  c.elementwise(2 * e * local * h, 1, p);             // post-attention norm
  if (block.moe.enabled())
    expertMLP(c, block, p);
  else
    denseMLP(c, block, T, fRank, p);
  c.elementwise((3 * e + mask) * local * h, 1, p);    // bias, dropout, residual add

  // Two reductions a pass: after attention and after the MLP (their transposes backward).
  double reductions = 2 * c.activationReduction();
  p.forward.tp = c.exposedTP(reductions, p.forward.gemm);
  p.backward.tp = c.exposedTP(reductions, p.backward.gemm);
  return p;
}

/// The embedding lookup on the first virtual stage: a vocab-parallel gather whose partial
/// rows are all-reduced (reduce-scattered with sequence parallelism), learned positions
/// added, dropout; its backward accumulates rows into the fp32 gradient.
PassTime embeddingForward(const WorkContext &c, PassTime &backward) {
  const ModelSpec &model = c.program.model;
  const double h = double(model.hidden), T = c.tokens, e = c.e;
  PassTime f;
  double bytes = 2 * e * T * h;
  if (model.position == Position::Learned)
    bytes += 2 * e * T * h;
  if (model.dropout > 0)
    bytes += (2 * e + 1) * c.localTokens() * h;
  f.memory = c.gpu.memorySeconds(bytes, 2);
  backward.memory += c.gpu.memorySeconds((e + 8) * T * h, 2);
  double act = e * T * h;
  f.tp = c.sp ? c.comm.reduceScatter(act, c.tpGroup) : c.comm.allReduce(act, c.tpGroup);
  if (c.sp)
    backward.tp += c.comm.allGather(act, c.tpGroup);
  return f;
}

/// The final norm, the vocab-parallel head and the fp32 cross entropy on the last virtual
/// stage, with three small all-reduces (max, target logit, sum of exponentials).
PassTime headForward(const WorkContext &c, PassTime &backward) {
  const ModelSpec &model = c.program.model;
  const double h = double(model.hidden), T = c.tokens, e = c.e;
  const double vRank = double(c.mapping.paddedVocab) / c.tp;
  PassTime f;
  f.memory = c.gpu.memorySeconds(2 * e * c.localTokens() * h) +
             c.gpu.memorySeconds((e + 3 * 4) * T * vRank, 3);
  f.gemm = c.gpu.gemmSeconds(T, vRank, h);
  backward.memory += c.gpu.memorySeconds(4 * e * c.localTokens() * h) +
                     c.gpu.memorySeconds((4 + e) * T * vRank);
  backward.gemm += c.gpu.gemmSeconds(T, h, vRank) + c.gpu.gemmSeconds(h, vRank, T);
  double act = e * T * h;
  f.tp = 3 * c.comm.allReduce(4 * T, c.tpGroup) + (c.sp ? c.comm.allGather(act, c.tpGroup) : 0);
  backward.tp += c.sp ? c.comm.reduceScatter(act, c.tpGroup) : c.comm.allReduce(act, c.tpGroup);
  return f;
}

/// Forward FLOPs of one token through the last virtual stage's head.
double headFlopsPerToken(const ModelSpec &model, int64_t vocab) {
  return 2 * double(model.hidden) * double(vocab);
}

} // namespace

WorkTable buildWorkTable(const Program &program, const Mapping &mapping) {
  const ModelSpec &model = program.model;
  const ParallelSpec &par = program.parallel;
  WorkContext c(program, mapping);
  WorkTable table;
  table.tp = c.tpGroup;
  table.dp = geometryOf(mapping.layout, RankLayout::kGradientAxes);
  table.pp = geometryOf(mapping.layout, Axis::PP);
  table.cp = geometryOf(mapping.layout, Axis::CP);
  table.ep = c.epGroup;
  table.expertDp = expertGeometry(mapping.layout, true);
  const int64_t pp = mapping.pp, virtualStages = pp * mapping.chunks;
  table.stageCount = pp;

  // Blocks of one layer group share their passes, FLOPs and parameters: each group is
  // costed once, and a virtual stage adds its groups' shares (O(groups), not O(blocks)).
  struct Group {
    const LayerGroup *layer;
    int64_t first, last; // its blocks [first, last)
    BlockPasses passes;
    double flops, recomputed, params, expertParams;
  };
  std::vector<Group> groups;
  int64_t first = 0;
  for (const LayerGroup &g : model.layers) {
    if (g.kind != LayerGroup::Transformer)
      continue;
    double recomputed = par.recompute == Recompute::Full ? blockForwardFlopsPerToken(model, g)
                        : par.recompute == Recompute::Selective
                            ? attentionCoreFlopsPerToken(model, g)
                            : 0;
    ParamCount params = blockParams(model, g);
    groups.push_back({&g, first, first + g.count, blockPasses(c, g),
                      blockForwardFlopsPerToken(model, g), recomputed,
                      double(params.perRank(mapping.tp, mapping.ep)),
                      double(params.expertPerRank(mapping.tp, mapping.ep))});
    first += g.count;
  }

  table.virtualStages.resize(size_t(virtualStages));
  for (int64_t v = 0; v < virtualStages; ++v) {
    VirtualStageWork &w = table.virtualStages[size_t(v)];
    auto [first, last] = mapping.partition.blocks[size_t(v)];
    w.firstBlock = first;
    w.lastBlock = last;
    double flops = 0, recomputed = 0;
    for (const Group &g : groups) {
      double n = double(std::max<int64_t>(0, std::min(last, g.last) - std::max(first, g.first)));
      if (n == 0)
        continue;
      const BlockPasses &p = g.passes;
      w.forward += p.forward.scaled(n);
      w.backward += p.backward.scaled(n);
      if (par.recompute == Recompute::Full)
        w.recompute += p.forward.scaled(n);
      else if (par.recompute == Recompute::Selective)
        w.recompute += p.attentionCore.scaled(n);
      flops += n * g.flops;
      recomputed += n * g.recomputed;
      w.params += n * g.params;
      w.expertParams += n * g.expertParams;
    }
    double modelFlops = 3 * flops, hardwareFlops = 3 * flops + recomputed;
    if (v == 0) {
      w.forward += embeddingForward(c, w.backward);
      w.params += double(embeddingParams(model, mapping.paddedVocab).perRank(mapping.tp));
    }
    if (v == virtualStages - 1) {
      w.forward += headForward(c, w.backward);
      w.params += double(finalNormParams(model).perRank(mapping.tp));
      if (!model.tiedHead() || pp > 1)
        w.params += double(headParams(model, mapping.paddedVocab).perRank(mapping.tp));
      modelFlops += 3 * headFlopsPerToken(model, model.vocab);
      hardwareFlops += 3 * headFlopsPerToken(model, mapping.paddedVocab);
    }
    w.modelFlops = modelFlops * c.tokens / c.tp;
    w.hardwareFlops = hardwareFlops * c.tokens / c.tp;
  }

  if (pp > 1) {
    // Each tp rank sends its 1/tp slice (sequence parallel, or Megatron's scatter/gather).
    table.messageBytes = c.e * c.tokens * double(model.hidden) / c.tp;
    table.transferSeconds = c.comm.send(table.messageBytes, table.pp.crossesNodes());
  }
  addDataParallelWork(program, mapping, c.comm, table);
  return table;
}

} // namespace parc
