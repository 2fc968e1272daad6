//===- ActivationModel.cpp - The activations a pipeline stage holds at its peak ---===//
//
// What parc's plans keep for the backward, tensor by tensor (ChunkLowering.cpp decides it and
// parrun frees everything else after its last use), and the transient buffers around the peak,
// which is the start of the first backward: every in-flight forward's kept tensors plus what
// that backward allocates before it frees them. docs/memory-and-cost.md derives each term;
// test/runtime/memory_sweep.py holds parrun's measured peaks against them.
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/MemoryModel.h"

#include <algorithm>

namespace parc {

namespace {
/// The experts' backward per routed row above what the block keeps of it (the row and its MLP
/// intermediates), at its widest moment: the down projection writes its input gradient beside
/// the rows' gradient it reads; SwiGLU's backward then writes the gate and up gradients beside
/// that input gradient, once the rows' gradient and the activated rows have died; the up
/// projection's backward writes its part of the rows' gradient beside the gate projection's
/// part and its own input gradient, once the activated, gate and up rows have died (the widest
/// when ffn / tp is small against hidden).
double expertBackwardRowBytes(const ModelSpec &model, const LayerGroup &block, double rows,
                              int64_t tp) {
  const double ffn = double(block.moe.ffn) / double(tp), h = double(model.hidden);
  const double perRow =
      isGated(block.mlp) ? std::max({ffn + h, 2 * ffn, 2 * h - 2 * ffn}) : ffn + h;
  return double(bytesPerElement(model.dtype)) * rows * perRow;
}

/// The sizes of one block on one tensor-parallel rank, in elements, and the activation dtype.
struct BlockShape {
  double sb, h, q, kv, f, heads, s, b, e, r; // r: 1/t for sequence-split tensors, else 1
  bool swiglu, flash, dropout, ring, exchanged = false; // exchanged: ep > 1
  // A MoE block: f is its shared experts' width; `experts` what its routed experts keep for
  // `expertRows` rows (ExpertLoad's share) of `expertFfn` columns each; `slots` the top-k
  // slots of the block's tokens, whose returned expert outputs the combine reads.
  double experts = 0, expertRows = 0, expertFfn = 0, slots = 0;

  BlockShape(const ModelSpec &model, const LayerGroup &block, int64_t microBatch, int64_t tp,
             bool sequenceParallel, bool ring, ExpertLoad load)
      : ring(ring) {
    const double t = double(tp), d = double(headDim(model, block));
    s = double(model.seq);
    b = double(microBatch);
    sb = s * b;
    h = double(model.hidden);
    heads = double(block.heads) / t;
    q = heads * d;
    // A rank holds kv_heads / tp key/value heads, or one whole head when kv_heads < tp.
    kv = double(std::max<int64_t>(block.kvHeads / tp, 1)) * d;
    f = double(block.moe.enabled() ? block.moe.sharedFfn() : block.ffn) / t;
    e = double(bytesPerElement(model.dtype));
    r = sequenceParallel ? 1 / t : 1;
    swiglu = isGated(block.mlp); // SwiGLU and GeGLU keep gate, up and product
    flash = model.attention == Attention::Flash;
    dropout = model.dropout > 0;
    if (block.moe.enabled()) {
      ExpertRows rows = parc::expertRows(block.moe, sb, load.ep);
      expertRows = load.worst ? rows.bound : rows.expected;
      exchanged = load.ep > 1;
      expertFfn = double(block.moe.ffn) / t;
      experts = expertActivationBytes(model, block, sb, expertRows, tp);
      slots = sb * double(block.moe.topK);
    }
  }

  /// What the attention keeps besides q, k, v and its output: FlashAttention the fp32
  /// logsumexp of each row; standard attention the probabilities, and with dropout its mask
  /// and output (FlashAttention regenerates the mask from the RNG state).
  double attentionCore() const {
    // Ring attention (RingLowering.cpp): the logsumexp and merged output of each query chunk,
    // which its blocks' backward read, beside their concatenation (the attention's output).
    if (ring)
      return 4 * b * heads * s + e * sb * q;
    if (flash)
      return 4 * b * heads * s;
    double scores = heads * s * s * b;
    return e * scores + (dropout ? (1 + e) * scores : 0);
  }
  /// The block's activations without recompute: the block input, both norms' outputs and
  /// ln2's input (split with the sequence under sequence parallelism), q, k, v, the attention
  /// output and core, the MLP's intermediates, and with dropout the two 1-byte masks.
  double keptWithoutRecompute() const {
    double kept = e * 4 * sb * h * r + e * sb * (2 * q + 2 * kv) + attentionCore();
    kept += e * (swiglu ? 3 : 2) * sb * f + experts;
    return kept + (dropout ? 2 * sb * h * r : 0);
  }
};
} // namespace

double blockActivationBytes(const ModelSpec &model, const LayerGroup &block, int64_t microBatch,
                            int64_t tp, Recompute recompute, bool sequenceParallel, bool ring,
                            ExpertLoad load) {
  BlockShape x(model, block, microBatch, tp, sequenceParallel, ring, load);
  if (recompute == Recompute::Full)
    return x.e * x.sb * x.h * x.r; // only the block's input survives the forward
  double kept = x.keptWithoutRecompute();
  // Selective recompute reruns the attention in the backward: its output and core are rebuilt.
  if (recompute == Recompute::Selective)
    kept -= x.e * x.sb * x.q + x.attentionCore();
  return kept;
}

double blockBackwardTransientBytes(const ModelSpec &model, const LayerGroup &block,
                                   int64_t microBatch, int64_t tp, Recompute recompute,
                                   bool sequenceParallel, bool ring, ExpertLoad load) {
  BlockShape x(model, block, microBatch, tp, sequenceParallel, ring, load);
  // The MLP's backward is the widest moment: the down projection's input gradient (sbf) beside
  // the gradient it reads (whole over the sequence) and the residual's skip gradient; SwiGLU's
  // backward then holds the gate and up gradients at once.
  double transient = x.e * x.sb * (x.f + x.h + x.h * x.r);
  if (x.swiglu)
    transient = std::max(transient, x.e * x.sb * (2 * x.f + x.h * x.r));
  if (x.expertRows > 0) {
    // A MoE block's backward starts at the combine, which reads the returned expert outputs of
    // every slot and writes their gradient, beside the skip gradient, the combined output's
    // gradient and, with shared experts, theirs. With ep > 1 an all-to-all then receives the
    // rows' output gradient while the slots' still lives (the returned outputs, kept in
    // `experts`, have died). The experts' backward follows, per row.
    double shared = x.f > 0 ? x.sb * x.h : 0, skip = x.sb * x.h * x.r + shared;
    double combine = skip + x.sb * x.h + x.slots * x.h;
    double exchange = x.exchanged ? skip + x.expertRows * x.h : 0;
    double experts = x.e * (skip - x.slots * x.h) +
                     expertBackwardRowBytes(model, block, x.expertRows, tp);
    transient = std::max({transient, x.e * combine, x.e * exchange, experts});
  }
  if (recompute == Recompute::Full) {
    // The block's forward is rerun first; under sequence parallelism it rebuilds the gathered
    // norm outputs whole.
    transient +=
        x.keptWithoutRecompute() - x.e * x.sb * x.h * x.r + 2 * x.e * x.sb * x.h * (1 - x.r);
  }
  return transient;
}

double expertActivationBytes(const ModelSpec &model, const LayerGroup &block, double tokens,
                             double rows, int64_t tp) {
  const MoESpec &moe = block.moe;
  const double e = double(bytesPerElement(model.dtype)), h = double(model.hidden);
  const double k = double(moe.topK);
  // The source's side: router logits, the top-k weights, their expert ids (int64) and the
  // expert outputs returned per slot, which the weights' gradient reads.
  double source = e * tokens * (double(moe.experts) + k + k * h) + 8 * tokens * k;
  // The expert's side: the dispatched rows (whole on every tp rank) and the expert MLP's
  // intermediates (split over tp like a dense MLP's).
  const double mlpKept = isGated(block.mlp) ? 3 : 2;
  return source + e * rows * (h + mlpKept * double(moe.ffn) / double(tp));
}

namespace {
/// The head's kept tensors per microbatch: the final norm's input and output (split under
/// sequence parallelism), the fp32 logits of this rank's vocabulary shard, the labels and the
/// loss.
double headKeptBytes(const ModelSpec &model, int64_t paddedVocab, int64_t microBatch, int64_t tp,
                     bool sequenceParallel) {
  const double sb = double(model.seq) * double(microBatch), t = double(tp);
  const double e = double(bytesPerElement(model.dtype));
  const double r = sequenceParallel ? 1 / t : 1;
  return 2 * e * sb * double(model.hidden) * r + 4 * sb * double(paddedVocab) / t + 8 * sb + e;
}

/// The head's backward: the cross entropy writes the logits' gradient over the logits (they
/// die there) beside its two row statistics and the loss gradient; then the head's matmul
/// backward writes its input's gradient (whole over the sequence) beside the logits' gradient.
/// Under sequence parallelism the final norm's kept output is first gathered again, whole,
/// and the split copy dies at that gather.
double headTransientBytes(const ModelSpec &model, int64_t microBatch, int64_t tp,
                          bool sequenceParallel) {
  const double sb = double(model.seq) * double(microBatch);
  const double e = double(bytesPerElement(model.dtype));
  const double regathered = sequenceParallel ? 1 - 1 / double(tp) : 0;
  return std::max(2 * sb * e + e, (1 + regathered) * e * sb * double(model.hidden));
}
} // namespace

double stageActivationBytes(const Program &program, const Mapping &mapping, int64_t stage,
                            const std::vector<int64_t> &inFlight, bool worstRouting) {
  // Context parallelism splits every activation along the sequence: a cp rank's tensors are
  // those of its seq / cp positions (ring attention keeps no scores, only each row's
  // logsumexp), so the model below is the rank's share of the sequence.
  ModelSpec share;
  if (mapping.cp > 1) {
    share = program.model;
    share.seq /= mapping.cp;
  }
  const ModelSpec &model = mapping.cp > 1 ? share : program.model;
  const ParallelSpec &par = program.parallel;
  const int64_t tp = mapping.tp, mb = mapping.microBatch;
  const double sb = double(model.seq) * double(mb);
  const double r = par.sequenceParallel ? 1 / double(tp) : 1;
  const double e = double(bytesPerElement(model.dtype));
  const int64_t virtualStages = mapping.pp * mapping.chunks;
  const bool ring = mapping.cp > 1;
  const ExpertLoad load{worstRouting, mapping.ep};

  std::vector<double> kept, transient;
  double held = 0;
  for (int64_t chunk = 0; chunk < mapping.chunks; ++chunk) {
    int64_t virtualStage = chunk * mapping.pp + stage;
    auto [first, last] = mapping.partition.range(stage, chunk);
    double chunkKept = 0, chunkTransient = 0;
    for (int64_t i = first; i < last; ++i) {
      const LayerGroup &block = model.blockGroup(i);
      chunkKept += blockActivationBytes(model, block, mb, tp, par.recompute, par.sequenceParallel,
                                        ring, load);
      chunkTransient =
          std::max(chunkTransient, blockBackwardTransientBytes(model, block, mb, tp, par.recompute,
                                                               par.sequenceParallel, ring, load));
    }
    if (virtualStage == 0) // the token ids, and with dropout the embedding's 1-byte mask
      chunkKept += 8 * sb + (model.dropout > 0 ? sb * double(model.hidden) * r : 0);
    if (virtualStage == virtualStages - 1) {
      double head = headKeptBytes(model, mapping.paddedVocab, mb, tp, par.sequenceParallel);
      chunkKept += head;
      // The blocks' backward starts once the head's has freed its tensors.
      chunkTransient = std::max(headTransientBytes(model, mb, tp, par.sequenceParallel),
                                chunkTransient - (head - e));
    }
    kept.push_back(chunkKept);
    transient.push_back(chunkTransient);
    held += double(inFlight[size_t(chunk)]) * chunkKept;
  }
  // The interleaved schedule's first backward (of the last chunk) meets one more forward
  // output waiting for its send, and on the first stage the ids of one more microbatch.
  double pending = 0;
  if (par.schedule == ScheduleKind::Interleaved)
    pending = e * sb * double(model.hidden) * r + (stage == 0 ? 8 * sb : 0);
  // The last chunk's backward comes first, with every forward in flight; another chunk's comes
  // after at least one of the last chunk's microbatches has been freed.
  const size_t lastChunk = kept.size() - 1;
  double peak = transient[lastChunk];
  for (size_t c = 0; c < lastChunk; ++c)
    peak = std::max(peak, transient[c] - kept[lastChunk]);
  return held + peak + pending;
}

} // namespace parc
