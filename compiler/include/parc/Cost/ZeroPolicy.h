//===- ZeroPolicy.h - What ZeRO shards, gathers and reduces, decided once --===//
//
// ZeRO (Rajbhandari et al. 2020) over the data-parallel group of size n, as parc plans it:
//
// - Parameters are grouped into buckets: runs of whole layers (a transformer block, the word
//   embedding, the final norm, ...) of one model chunk, taken in the order the backward
//   finishes their gradients and closed once they hold `bucket_size` parameters (Megatron-LM's
//   DDP buckets, which are also its distributed optimizer's shards). The word embedding and the
//   head are always a bucket of their own, so that a tied embedding's two copies (first and
//   last stage) are partitioned alike. A bucket is one flat vector, zero-padded to a multiple of
//   n, and data-parallel member i owns elements [i n'/n, (i+1) n'/n).
// - zero 1 shards the optimizer state; the whole gradient of a bucket is held from its first
//   write in the step until it is reduce-scattered once, after the last backward.
// - zero 2 also shards the gradients: each bucket is reduce-scattered as soon as a backward
//   has written it for the last time, into the owned shard that accumulates the microbatches,
//   and its whole gradient is released, so at most the buckets being written are whole.
// - zero 3 also shards the weights: each bucket is gathered just before the first op of a
//   forward or backward that reads it and released after the last one; only the owned shard
//   stays.
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
/// Experts: the experts of one MoE block, bucketed apart from the dense units because they are
/// sharded over the expert-data-parallel group.
enum class ParamUnitKind { WordEmbedding, PositionEmbedding, Block, FinalNorm, Head, Experts };

/// One unit of a virtual stage, as one tensor-parallel rank holds it.
struct ParamUnit {
  ParamUnitKind kind = ParamUnitKind::Block;
  int64_t block = -1;   // the transformer block, for ParamUnitKind::Block and Experts
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

/// The data-parallel traffic of one pipeline stage per step, as the policy moves it, in
/// elements of one rank (multiply by the bytes of the gradient or weight dtype).
struct ZeroTraffic {
  /// One collective per bucket per event; `events` per step.
  int64_t gradElements = 0; // padded elements all-reduced or reduce-scattered per event
  int64_t gradEvents = 0;   // 1 per step, or M (once per microbatch)
  int64_t weightElements = 0; // padded elements all-gathered per event
  int64_t weightEvents = 0;   // 1 per step (zero 1, 2), 2M (zero 3: forward and backward)
  int64_t buckets = 0, largestBucket = 0; // padded elements of the largest
};

/// `stageUnits[c]` are the backward-ordered units of the stage's chunk c.
ZeroTraffic zeroTraffic(const ZeroPolicy &policy,
                        llvm::ArrayRef<std::vector<ParamUnit>> stageUnits, int64_t microbatches);

} // namespace parc

#endif
