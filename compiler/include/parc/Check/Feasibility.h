//===- Feasibility.h - The mapping rules as predicates --------------------===//
//
// The divisibility rules every mapping satisfies, without diagnostics: checkMapping reports a
// violated rule at the field to change, with its fix; the search skips the candidates that
// violate one and only counts them. Both read these predicates, so they cannot disagree.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_CHECK_FEASIBILITY_H
#define PARC_CHECK_FEASIBILITY_H

#include "parc/Check/Mapping.h"
#include "parc/Sema/Program.h"

#include <optional>
#include <vector>

namespace parc {

/// What tp fails to split of one layer's attention and MLP, as bits: each tensor-parallel rank
/// holds whole heads, whole key/value heads or whole copies of them, and ffn / tp columns.
enum TensorSplitFailure : unsigned { SplitsHeads = 1, SplitsKvHeads = 2, SplitsFfn = 4 };
unsigned tensorSplitFailures(int64_t heads, int64_t kvHeads, int64_t ffn, int64_t tp);
/// tp splits every layer group's heads, key/value heads (or replicates whole ones), ffn and
/// expert widths.
bool tensorParallelSplits(const ModelSpec &model, int64_t tp);
/// Sequence parallelism needs tp > 1 and the positions a rank holds (seq / cp) a multiple of tp.
bool sequenceParallelSplits(const ModelSpec &model, int64_t tp, int64_t cp = 1);
/// Context parallelism cuts the sequence into 2 x cp chunks of equal length, rank r of the cp
/// group holding chunks r and 2cp - 1 - r (Megatron-Core's and Transformer Engine's balance of
/// the causal mask): seq must be a multiple of 2 x cp.
bool contextParallelSplits(const ModelSpec &model, int64_t cp);
/// Megatron-Core's RankGenerator refuses an order that leaves out an axis larger than 1.
bool orderNamesAxes(const RankOrder &order, const AxisSizes &sizes);
/// What a MoE block's settings fail, as bits: top_k <= experts, ep splits the experts, tp
/// splits each expert's moe_ffn columns and the shared experts' columns.
enum ExpertSplitFailure : unsigned {
  RoutesTooMany = 1,
  SplitsExperts = 2,
  SplitsExpertFfn = 4,
  SplitsSharedFfn = 8
};
unsigned expertSplitFailures(const MoESpec &moe, int64_t ep, int64_t tp);
/// ep divides dp x cp (`carved`, the ranks it is carved from) and every MoE block's experts
/// (and is 1 without experts); top_k <= experts.
bool expertParallelSplits(const ModelSpec &model, int64_t ep, int64_t carved);
/// Why the blocks do not split into stages: unevenly (or pp x chunks overflows), a
/// stage_layers list of another length than pp x chunks, or one that does not sum to the blocks.
enum class PartitionFailure { Uneven, StageCount, BlockSum };
/// The blocks of every virtual stage: an even split, or stage_layers' list; nullopt when the
/// blocks do not split into pp x chunks stages that way, with the reason in `why`.
std::optional<StagePartition> partitionBlocks(int64_t blocks, int64_t pp, int64_t chunks,
                                              const std::vector<int64_t> &stageLayers,
                                              PartitionFailure *why = nullptr);
/// The vocabulary padded to a multiple of 128 x tp (Megatron's make-vocab-size-divisible-by
/// times tp); nullopt on overflow.
std::optional<int64_t> paddedVocab(int64_t vocab, int64_t tp);

/// The mapping of a program whose parallel spec satisfies every rule, with dp already known
/// and the partition from partitionBlocks.
Mapping makeMapping(const Program &program, int64_t dp, StagePartition partition,
                    int64_t padded);

} // namespace parc

#endif
