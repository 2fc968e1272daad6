//===- MemoryModel.h - Parameters, model states and activations per rank --===//
//
// The one place parc counts parameters and the bytes every pipeline stage holds: weights,
// gradients and optimizer state under mixed precision and ZeRO (Rajbhandari et al. 2020),
// activations by Korthikanti et al. 2022, and the cluster's reserve. Every rank of one stage
// holds the same bytes (tp and dp ranks are symmetric), so the model works per stage.
// docs/memory-and-cost.md derives each formula.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_MEMORYMODEL_H
#define PARC_COST_MEMORYMODEL_H

#include "parc/Check/Mapping.h"
#include "parc/Cost/ZeroPolicy.h"
#include "parc/Sema/Program.h"
#include "parc/Support/Diagnostics.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace parc {

/// Elements of one part of the model, split by how tensor parallelism treats them.
struct ParamCount {
  int64_t sharded = 0;    // split evenly over the tp ranks (column/row-parallel weights)
  int64_t replicated = 0; // held in full by every tp rank (norms, row-parallel biases)
  /// The key and value projections, split by whole heads: over tp ranks when there are at least
  /// as many key/value heads, else each rank holds one whole head (Megatron replicates a head
  /// over the tp / kvHeads ranks that read it).
  int64_t keyValue = 0;
  int64_t kvHeads = 1; // of the one block counted; a sum of blocks keeps only the total
  /// The experts of a mixture-of-experts block: split over the ep ranks (whole experts) and
  /// each over tp (column- and row-parallel like a dense MLP). Their gradients and optimizer
  /// state are reduced and ZeRO-sharded over the expert-data-parallel group, not dp.
  int64_t expert = 0;
  /// The experts one token passes through: expert * top_k / experts.
  int64_t activeExpert = 0;

  int64_t total() const { return sharded + replicated + keyValue + expert; }
  /// The parameters one token's forward pass uses (Mixtral's "active parameters").
  int64_t active() const { return total() - expert + activeExpert; }
  /// What one tensor-parallel rank holds of the dense layers (of one block, or of layers
  /// without key/value heads).
  int64_t densePerRank(int64_t tp) const {
    return sharded / tp + keyValue / std::min(tp, std::max<int64_t>(kvHeads, 1)) + replicated;
  }
  int64_t expertPerRank(int64_t tp, int64_t ep) const { return expert / (tp * ep); }
  int64_t perRank(int64_t tp, int64_t ep = 1) const {
    return densePerRank(tp) + expertPerRank(tp, ep);
  }
  ParamCount &operator+=(const ParamCount &o) {
    sharded += o.sharded;
    replicated += o.replicated;
    keyValue += o.keyValue;
    expert += o.expert;
    activeExpert += o.activeExpert;
    return *this;
  }
};

/// Megatron's GPT has a bias on every linear layer; the Llama family (RMSNorm) has none; Qwen2
/// only on the query, key and value projections (model.bias).
bool hasLinearBiases(const ModelSpec &model);
bool hasQKVBias(const ModelSpec &model);
/// The width of one attention head: the model's head_dim, or hidden / heads of the block's
/// group.
int64_t headDim(const ModelSpec &model, const LayerGroup &block);

/// A transformer block's two sub-layers, each with its norm: the attention (ln1, q, k, v, the
/// output projection) and the MLP (ln2, the dense MLP or a MoE block's router, shared experts
/// and experts).
struct BlockHalves {
  ParamCount attention, mlp;
};
BlockHalves blockHalves(const ModelSpec &model, const LayerGroup &block);
/// One transformer block: both halves.
ParamCount blockParams(const ModelSpec &model, const LayerGroup &block);
/// Word embedding over the padded vocab, plus learned positions, max_positions of them (not
/// split by tp).
ParamCount embeddingParams(const ModelSpec &model, int64_t paddedVocab);
/// The output projection over the padded vocab (its own matrix, whether or not it is tied).
ParamCount headParams(const ModelSpec &model, int64_t paddedVocab);
/// The norm after the last block.
ParamCount finalNormParams(const ModelSpec &model);
/// Every distinct parameter of the model: a tied head shares the embedding's matrix.
int64_t totalParams(const ModelSpec &model, int64_t paddedVocab);
/// The parameters one token uses: every dense one, top_k of each MoE block's experts.
int64_t activeParams(const ModelSpec &model, int64_t paddedVocab);

/// Rows of the expert tokens one rank holds per MoE block and microbatch of `tokens` tokens:
/// `expected` when the router balances the experts (tokens x top_k, the same whatever ep),
/// `bound` the most the all-to-all can deliver. Dropless, that is every token of the ep group
/// on this rank's experts, ep x tokens x min(top_k, experts / ep); a capacity factor c bounds
/// each expert to ceil(c x tokens x top_k / experts) tokens from each ep rank.
struct ExpertRows {
  double expected = 0, bound = 0;
};
ExpertRows expertRows(const MoESpec &moe, double tokens, int64_t ep);
/// Which of ExpertRows a MoE block's activations are counted at: the balanced share
/// (`expected`), or with `worst` as many rows as the all-to-all of an `ep` group can deliver
/// (`bound`), which parrun's static buffers hold whatever the router does.
struct ExpertLoad {
  bool worst = false;
  int64_t ep = 1;
};

/// The parameter units of virtual stage `virtualStage` as one tp rank holds them, in the order
/// the backward finishes their gradients: the head (its own matrix, or a tied head's copy on a
/// stage without the embedding), the final norm, the blocks from last to first, each as its MLP
/// then its attention (BlockHalves), the learned positions and the word embedding. ZeRO groups
/// them into buckets (ZeroPolicy.h); a unit test checks that the lowering's shards form the
/// same buckets. A MoE block's MLP counts here without its experts, which expertUnits lists.
std::vector<ParamUnit> virtualStageUnits(const ModelSpec &model, const Mapping &mapping,
                                         int64_t virtualStage);
/// Whether the head reads the word embedding on the embedding's own chunk (a tied head on a
/// pipeline of one virtual stage), so that ZeRO's walks see that unit at both ends.
bool headReadsWordEmbedding(const ModelSpec &model, const Mapping &mapping);
/// The experts of every MoE block of the virtual stage as one rank holds them (experts / ep
/// whole experts, each split over tp), blocks from last to first: ZeRO buckets them apart,
/// over the expert-data-parallel group.
std::vector<ParamUnit> expertUnits(const ModelSpec &model, const Mapping &mapping,
                                   int64_t virtualStage);

/// Bytes one parameter costs before ZeRO sharding.
struct StateBytesPerParam {
  double weight = 0;    // the working copy in the model's dtype
  double grad = 0;      // the main gradient in train.grad_dtype (fp32 unless set)
  double optimizer = 0; // fp32 master copy (mixed precision) plus the optimizer's moments

  double total() const { return weight + grad + optimizer; }
};
StateBytesPerParam stateBytesPerParam(const Program &program);

/// Bytes one transformer block keeps for its backward, per microbatch, on one tp rank: what
/// parc's op lists keep (ActivationModel.cpp). With standard attention and dropout it is
/// Korthikanti et al. 2022's table 2 (generalised to grouped-query attention, any ffn width and
/// SwiGLU); FlashAttention keeps only the row logsumexp of the attention core, dropout 0 no
/// masks, and selective recompute also rebuilds the attention's output. With `ring` (context
/// parallelism) the attention is ring attention whatever model.attention says: it keeps each
/// query chunk's logsumexp and merged output beside their concatenation (`model.seq` is then
/// the rank's share of the sequence).
double blockActivationBytes(const ModelSpec &model, const LayerGroup &block, int64_t microBatch,
                            int64_t tp, Recompute recompute, bool sequenceParallel,
                            bool ring = false, ExpertLoad load = {});
/// The bytes one block's backward holds above the kept activations, per microbatch on one tp
/// rank: its widest moment (the MLP's gradients) and, with full recompute, the rebuilt forward.
double blockBackwardTransientBytes(const ModelSpec &model, const LayerGroup &block,
                                   int64_t microBatch, int64_t tp, Recompute recompute,
                                   bool sequenceParallel, bool ring = false,
                                   ExpertLoad load = {});
/// The peak activation bytes of pipeline stage `stage` with inFlight[c] forwards of chunk c
/// held: every kept tensor plus the transient buffers of the first backward. MoE blocks count
/// at the balanced rows, or with `worstRouting` at the mapping's ExpertRows::bound, each moment
/// of their backward included.
double stageActivationBytes(const Program &program, const Mapping &mapping, int64_t stage,
                            const std::vector<int64_t> &inFlight, bool worstRouting = false);

/// The part of a MoE block's activations that depends on how many expert rows a rank holds
/// (`rows`, ExpertRows): the router's outputs for the microbatch's `tokens` and the expert
/// MLP's per row.
double expertActivationBytes(const ModelSpec &model, const LayerGroup &block, double tokens,
                             double rows, int64_t tp);
/// How many forward passes of each model chunk a stage holds at its peak: entry c counts the
/// in-flight microbatches of chunk c. GPipe keeps all M; 1F1B min(pp - stage, M); interleaved
/// Megatron's warm-up count plus the one running, walked through the chunks in schedule order.
std::vector<int64_t> microbatchesInFlight(ScheduleKind schedule, int64_t pp, int64_t stage,
                                          int64_t microbatches, int64_t chunks);

/// The bytes every rank of one pipeline stage holds.
struct StageMemory {
  int64_t stage = 0;
  int64_t blocks = 0;        // transformer blocks on the stage, all chunks
  int64_t paramsPerRank = 0; // parameters one rank owns before ZeRO sharding
  int64_t expertParamsPerRank = 0; // of which experts, sharded by ZeRO over expert dp
  /// Activations beyond `activations` when routing is as unbalanced as dropless allows: the
  /// stage's peak with every MoE block at ExpertRows::bound rather than expected, its in-flight
  /// microbatches' expert rows and each moment of its backward.
  double expertWorstCase = 0;
  int64_t inFlight = 0;      // microbatches whose activations the stage keeps at its peak
  /// Weights, gradients and optimizer state as ZeRO shards them (ZeroPolicy.h); for ZeRO 1 the
  /// whole gradient buckets, which exist from their first write to their reduce-scatter.
  double weights = 0, grads = 0, optimizer = 0;
  double gathered = 0;    // ZeRO-3: the buckets gathered whole at once (the largest, usually)
  double gradBuffers = 0; // transient: ZeRO-2/3's whole buckets, reduction and op scratch
  double activations = 0;
  double reserve = 0;

  /// Weights, gradients and optimizer state: the ZeRO paper's "model states".
  double modelStates() const { return weights + grads + optimizer; }
  double total() const { return modelStates() + gathered + gradBuffers + activations + reserve; }
};

struct MemoryEstimate {
  std::vector<StageMemory> stages;
  int64_t gpuMemory = 0;

  /// The stage that needs the most bytes (the first one on a tie).
  const StageMemory &worst() const;
  double maxRankBytes() const { return worst().total(); }
  bool fits() const { return maxRankBytes() <= double(gpuMemory); }
};

/// The memory of every stage of `program` under `mapping` (as built by checkMapping).
MemoryEstimate estimateMemory(const Program &program, const Mapping &mapping);

/// Reports an error at the parallel block's header when a rank needs more than gpu.memory,
/// with a note on the worst rank's breakdown and up to three changes parc verified to fit.
/// Returns true when every rank fits.
bool checkMemory(const Program &program, const Mapping &mapping, DiagnosticEngine &diags);

} // namespace parc

#endif
