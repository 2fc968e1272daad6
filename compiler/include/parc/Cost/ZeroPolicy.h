//===- ZeroPolicy.h - What ZeRO shards, gathers and reduces, decided once --===//
//
// ZeRO (Rajbhandari et al. 2020) over the data-parallel group of size n, as parc plans it:
//
// - Parameters are grouped into buckets: runs of whole units (a transformer block's attention
//   or its MLP, the word embedding, the final norm, ...) of one model chunk, taken in the order
//   the backward finishes their gradients and closed once they hold `bucket_size` parameters
//   (Megatron-LM's DDP buckets, which are also its distributed optimizer's shards; Megatron
//   closes a bucket at any parameter, parc at the end of a sub-layer). The word embedding and the
//   head are always a bucket of their own, so that a tied embedding's two copies (first and
//   last stage) are partitioned alike. A bucket is one flat vector, zero-padded to a multiple of
//   n, and data-parallel member i owns elements [i n'/n, (i+1) n'/n).
// - zero 1 shards the optimizer state; the whole gradient of a bucket is held from its first
//   write in the step until it is reduce-scattered once, after the last backward.
// - zero 2 also shards the gradients: each bucket is reduce-scattered as soon as a backward
//   has written it for the last time, into the owned shard that accumulates the microbatches,
//   and its whole gradient is released, so at most the buckets being written are whole.
// - zero 3 also shards the weights: a forward or backward gathers a bucket for each run of its
//   ops that read it (a run ends at an op reading another bucket of the same group), just
//   before the run's first op, and releases it after the run's last; only the owned shard
//   stays. So at most one bucket of a group is whole at a time, a full recompute that rereads a
//   sub-layer in the backward gathers it again there (as DeepSpeed's ZeRO-3 fetches a module
//   for the recomputed forward and again for its backward), and a tied head gathers the word
//   embedding again (gathersAroundUse).
// - zero 1 and 2 all-gather the updated weights after the optimizer step.
//
// Rules, the memory model, the cost model, the report and the lowering all read this one
// description; docs/memory-and-cost.md gives the bytes it implies.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_ZEROPOLICY_H
#define PARC_COST_ZEROPOLICY_H

#include "parc/Sema/Program.h"

#include "llvm/ADT/ArrayRef.h"

#include <cstdint>
#include <vector>

namespace parc {

/// A group of parameters ZeRO never splits between buckets.
/// Attention, MLP: the two sub-layers of a transformer block (MemoryModel's BlockHalves), each
/// with its norm. Experts: the experts of one MoE block, bucketed apart from the dense units
/// because they are sharded over the expert-data-parallel group.
enum class ParamUnitKind { WordEmbedding, PositionEmbedding, Attention, MLP, FinalNorm, Head, Experts };

/// Whether units of `kind` are one of a block's two sub-layers.
inline bool isSubLayer(ParamUnitKind kind) {
  return kind == ParamUnitKind::Attention || kind == ParamUnitKind::MLP;
}

/// One unit of a virtual stage, as one tensor-parallel rank holds it.
struct ParamUnit {
  ParamUnitKind kind = ParamUnitKind::Attention;
  int64_t block = -1;   // the transformer block, for Attention, MLP and Experts
  int64_t elements = 0; // parameters on one tp rank
};

/// Consecutive units [first, end) of one virtual stage's backward-ordered unit list.
struct ZeroBucket {
  size_t first = 0, end = 0;
  int64_t elements = 0;  // parameters in the bucket on one rank
  int64_t perMember = 0; // ceil(elements / n): the owned shard of each member

  int64_t padded(int64_t members) const { return perMember * members; }
};

/// When data-parallel gradients leave a rank.
enum class GradReduction {
  None,                      // dp = 1
  AllReducePerStep,          // zero 0: one all-reduce after the last backward
  ReduceScatterPerStep,      // zero 1
  ReduceScatterPerMicrobatch // zero 2 and 3: after every backward that writes the bucket
};

struct ZeroPolicy {
  int zero = 0;
  int64_t dp = 1;
  int64_t bucketElements = 40000000; // parallel.bucket_size

  /// ZeRO with one data-parallel rank has nothing to partition.
  bool partitioned() const { return zero >= 1 && dp > 1; }
  bool shardsOptimizer() const { return partitioned(); }
  bool shardsGrads() const { return partitioned() && zero >= 2; }
  bool shardsWeights() const { return partitioned() && zero >= 3; }
  GradReduction gradReduction() const;
  /// ZeRO-1/2: every member updates its shard and all-gathers the whole weights back.
  bool gathersWeightsAfterStep() const { return partitioned() && zero < 3; }
  /// ZeRO-3: each bucket is gathered around the ops that read it.
  bool gathersWeightsAroundUse() const { return shardsWeights(); }

  /// Groups `units` (one virtual stage, in backward order) into buckets; empty when the
  /// policy partitions nothing.
  std::vector<ZeroBucket> buckets(llvm::ArrayRef<ParamUnit> units) const;
};

ZeroPolicy zeroPolicy(const ParallelSpec &parallel, int64_t dp);

/// ZeRO-3's all-gathers of one family of a chunk's units, in padded elements of one rank.
struct PassGathers {
  double elements = 0;
  int64_t collectives = 0;
};
struct ZeroGathers {
  PassGathers forward, backward; // per forward, per backward
};

/// What ZeRO-3 gathers around use over one chunk: each family's gathers, and the most
/// elements whole at once.
struct ChunkGathers {
  ZeroGathers dense, experts;
  double peak = 0;
};

/// One chunk's unit families, as MemoryModel lists them in backward order: the dense units
/// under `policy`, the experts under `expertPolicy`. `oneGroup`: both are partitioned over the
/// same group (ep = 1), so an experts' read ends a dense bucket's run and back. `tiedHead`: the
/// word embedding is on this chunk and the head reads it (MemoryModel's headReadsWordEmbedding).
struct ChunkUnits {
  const ZeroPolicy &policy;
  llvm::ArrayRef<ParamUnit> units;
  const ZeroPolicy &expertPolicy;
  llvm::ArrayRef<ParamUnit> expertUnits;
  bool oneGroup = true;
  bool tiedHead = false;
};

/// ZeRO-3's gathers, from the order the passes read the units: the forward reads them from
/// last to first, a MoE block's experts after its MLP's router and before its shared experts,
/// and, with a tied head, the word embedding again at the end; the backward reads the head (or
/// the tied word embedding) and
/// the final norm, then each block's units (with `fullRecompute` first again in forward order,
/// for the recomputed forward; a MoE block's experts before its MLP), and not the embeddings.
/// Each run of reads of one bucket is one gather, whole from its first read to its last. A
/// unit test holds this to the lowering's instructions.
ChunkGathers gathersAroundUse(const ModelSpec &model, const ChunkUnits &chunk,
                              bool fullRecompute);

/// The most gradient elements zero 2 and 3 hold whole at once in a backward of one chunk,
/// both families: a bucket's gradient is whole from its first write to its reduce-scatter
/// after its last, and the backward writes the head's (or, with a tied head, the word
/// embedding's), the final norm's, each block's experts', MLP's and attention's, the
/// positions' and the word embedding's.
double gradientPeak(const ModelSpec &model, const ChunkUnits &chunk);

} // namespace parc

#endif
