//===- ChunkLowerer.h - The op lists of one virtual pipeline stage --------===//
//
// Internal to compiler/Lower: the class that ChunkLowering.cpp (attention, dense MLP,
// embedding, head) and MoELowering.cpp (mixture-of-experts MLPs) implement together.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_LOWER_CHUNKLOWERER_H
#define PARC_LOWER_CHUNKLOWERER_H

#include "LowerInternal.h"

#include <map>
#include <string>
#include <vector>

namespace parc::lower {

using plan::OpKind;
using Attrs = std::map<std::string, plan::AttrValue>;
using Shape = std::vector<int64_t>;

inline Attrs groupAttrs(plan::Group group) { return {{"group", plan::spelling(group).str()}}; }
inline Attrs groupDimAttrs(plan::Group group, int64_t dim) {
  return {{"group", plan::spelling(group).str()}, {"dim", dim}};
}
inline const Attrs linearAttrs = {{"trans_a", false}, {"trans_b", true}};

/// What a mixture-of-experts MLP's backward reads (MoELowering.cpp).
/// With ep > 1 the rows cross the ep group twice: `rows` leave for the members holding their
/// experts (`counts` per member and expert), arrive as `expertRows` (`routing`: the rows per
/// sending member and local expert), and the experts' outputs `expertOut` come back as
/// `down`. With ep = 1 the expert side is the token side and `routing` the logits.
struct MoEActivations {
  std::string logits;                 // the router's [seq, batch, experts]
  std::string rows;                   // the tokens' rows dispatched to the experts
  std::string counts;                 // ep > 1: rows per (ep member, its expert) sent
  std::string expertRows, routing;    // the rows the experts multiply, and their grouping
  std::string gate, up, activated;    // the experts' MLP over those rows
  std::string expertOut;              // the experts' outputs where they were computed
  std::string down;                   // the experts' outputs at their tokens, before the combine
  std::string sharedGate, sharedUp, sharedActivated; // the shared experts'
};

/// The activations a block's backward reads: the forward's, or their recomputed copies.
struct BlockActivations {
  std::string qkvNorm;   // ln1 as it leaves the norm (this rank's sequence part under SP)
  std::string qkvInput;  // ln1, all-gathered under sequence parallelism
  std::string q, k, v;   // attention inputs (rotated with RoPE)
  std::string context;   // attention output
  std::string stats;     // the attention's saved softmax: logsumexp rows or probabilities
  RingAttention ring;    // context parallelism: the chunks and merged results of the ring
  std::string residual;  // input of ln2
  std::string mlpNorm;   // ln2 as it leaves the norm
  std::string mlpInput;  // ln2, all-gathered under sequence parallelism
  std::string mlpGate;   // SwiGLU only: the gate projection
  std::string mlpHidden; // the up projection, input of the activation function
  std::string mlpActivated;
  MoEActivations moe;      // a mixture-of-experts block's MLP
  bool recomputed = false; // computed in the backward (full recompute)
};

/// The tensors of a row-parallel layer named `prefix`: the matmul's product (partial over tp
/// until reduced), the reduced sum and the output after the bias.
struct RowNames {
  std::string product, reduced, out;
};

class ChunkLowerer {
public:
  ChunkLowerer(const Job &job, int64_t virtualStage, int64_t tpRank, int64_t cpRank)
      : job(job), virtualStage(virtualStage), tpRank(tpRank), cpRank(cpRank),
        writer(job, result.chunk) {}

  LoweredChunk run();

private:
  //===--- Tensors and ops ---------------------------------------------===//
  std::string declare(const std::string &name, Shape shape, plan::DType dtype) {
    return writer.declare(name, std::move(shape), dtype);
  }
  std::string activation(const std::string &name, int64_t rows, int64_t width) {
    return writer.activation(name, rows, width);
  }
  std::string gradOf(const std::string &tensor) { return writer.gradOf(tensor); }
  void emit(OpKind kind, std::vector<std::string> inputs, std::vector<std::string> outputs,
            Attrs attrs = {}) {
    writer.emit(kind, std::move(inputs), std::move(outputs), std::move(attrs));
  }
  std::string param(const std::string &prefix, llvm::StringRef leaf) const {
    return prefix + "." + leaf.str();
  }

  //===--- Tensor-parallel pieces ----------------------------------------===//
  /// A norm over `x` with the parameters of `prefix`; returns its output as column-parallel
  /// layers read it (all-gathered along the sequence under sequence parallelism). `normOut`
  /// gets the norm's own output.
  std::string normForward(const std::string &x, const std::string &prefix, llvm::StringRef sfx,
                          std::string *normOut = nullptr);
  /// Under sequence parallelism, the backward of a column-parallel layer gathers its input
  /// again from the norm's sequence part, as Megatron-LM does, so that the forward keeps only
  /// that part; returns the tensor to read.
  std::string regathered(const std::string &normOut, const std::string &gathered,
                         bool recomputed = false);
  void normBackward(const std::string &x, const std::string &prefix, const std::string &dy,
                    const std::string &dx);
  /// Where column-parallel layers write the gradient of norm output `normOut`: a partial sum
  /// over tp that reduceColumnInputGrad completes into normOut.grad.
  std::string columnInputGrad(const std::string &normOut);
  void reduceColumnInputGrad(const std::string &normOut);
  std::string columnForward(const std::string &input, const std::string &prefix, int64_t width,
                            bool bias, llvm::StringRef sfx);
  /// dBias empty: the layer has no bias.
  void columnBackward(const std::string &input, const std::string &prefix,
                      const std::string &dInput, const std::string &dWeight,
                      const std::string &dBias);
  RowNames rowNames(const std::string &prefix, llvm::StringRef sfx) const;
  std::string rowForward(const std::string &input, const std::string &prefix, llvm::StringRef sfx);
  /// Returns the gradient of the layer's input, named after `inputName`.
  std::string rowBackward(const std::string &input, const std::string &inputName,
                          const std::string &prefix);
  /// A key/value projection shared by several tp ranks (kv_heads < tp): each computes a
  /// partial gradient; all-gather them over tp and add those of the ranks sharing the head.
  std::string sharedGradTarget(const std::string &param, const Shape &shape, const BlockDims &dims);
  void sumSharedGrad(const std::string &param, const Shape &shape, const BlockDims &dims);

  //===--- Model parts ----------------------------------------------------===//
  std::string embeddingForward();
  void embeddingBackward();
  BlockActivations blockForward(int64_t block, const std::string &x, llvm::StringRef sfx,
                                bool forRecompute);
  void blockBackward(int64_t block, const std::string &x, const BlockActivations &saved);
  /// The dense MLP's backward from the gradient of mlp.down to that of ln2's output.
  void denseMLPBackward(int64_t block, const BlockDims &dims, const BlockActivations &saved);

  //===--- Mixture of experts (MoELowering.cpp) ---------------------------===//
  /// The MLP half of a MoE block from `a.mlpInput`: router, dispatch, expert MLPs, combine
  /// and shared experts; returns the MLP's output. With `forRecompute` it stops once
  /// everything the backward reads exists and returns "".
  std::string moeForward(int64_t block, const BlockDims &dims, BlockActivations &a,
                         llvm::StringRef sfx, bool forRecompute);
  /// From the gradient of moeForward's output to that of ln2's output.
  void moeBackward(int64_t block, const BlockDims &dims, const BlockActivations &saved,
                   const std::string &dOut);
  /// ln2's gradient from the rows' (dRows) and the logits' (dLogits) gradients, through the
  /// dispatch, the router and the shared experts.
  void moeInputBackward(int64_t block, const BlockDims &dims, const BlockActivations &saved,
                        const std::string &dRows, const std::string &dLogits);
  /// Expert parallelism: rows `x` to the ep group's members in the blocks `counts` gives
  /// into `y` of `rows` rows; returns the counts of the blocks `y` received.
  std::string exchangeRows(const std::string &x, const std::string &counts, const std::string &y,
                           int64_t rows, int64_t width, int64_t localExperts);
  /// The tensor a block's MLP half ends in: the second operand of its residual add.
  static std::string mlpOutputName(int64_t block, const BlockDims &dims) {
    return blockName(block, !dims.moe.enabled()   ? "mlp.down"
                            : dims.moe.sharedExperts ? "moe.mlp"
                                                     : "moe.out");
  }
  Attrs normAttrs() const { return {{"eps", job.program.model.normEps}}; }
  Attrs ropeAttrs(int64_t heads) const {
    return lower::ropeAttrs(heads, 0, job.program.model.ropeTheta);
  }
  Attrs attentionAttrs(const BlockDims &dims) const {
    return {{"causal", true},
            {"flash", job.program.model.attention == Attention::Flash},
            {"heads", dims.localHeads},
            {"kv_heads", dims.localKvHeads}};
  }
  /// The attention's saved softmax for its backward: FlashAttention keeps the logsumexp of
  /// each row in fp32, standard attention the probabilities.
  std::string attentionStats(const std::string &name, const BlockDims &dims) {
    if (job.program.model.attention == Attention::Flash)
      return declare(name, {job.microBatch, dims.localHeads, job.seq}, plan::DType::FP32);
    return declare(name, {job.microBatch, dims.localHeads, job.seq, job.seq}, job.dtype);
  }
  RingSite ringSite(int64_t block, const BlockDims &dims) const {
    return RingSite{job,           block,         cpRank, dims.localHeads, dims.localKvHeads,
                    dims.headDim, job.program.model.position == Position::RoPE};
  }
  void headForward(const std::string &y);
  void headBackward(const std::string &y);
  /// The first row of the vocabulary this rank's embedding and head shards hold.
  int64_t vocabOffset() const { return tpRank * (job.paddedVocab / job.tp); }
  /// The loss sees the vocabulary's real entries only: the padding's logits are left out.
  Attrs lossAttrs() const {
    Attrs attrs = groupAttrs(plan::Group::TP);
    attrs["vocab"] = job.program.model.vocab;
    attrs["vocab_offset"] = vocabOffset();
    return attrs;
  }
  std::string headWeight() const { return (job.tiedHead ? WordEmbedding : HeadWeight).str(); }

  const Job &job;
  int64_t virtualStage, tpRank, cpRank;
  LoweredChunk result;
  OpWriter writer;
  std::string headInput; // the final norm's output as the head's matmul reads it
  std::string headNorm;  // the final norm's own output
};

} // namespace parc::lower

#endif
