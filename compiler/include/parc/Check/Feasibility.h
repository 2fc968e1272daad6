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
/// ep divides dp x cp (`carved`, the ranks it is carved from) and every MoE block's experts
/// (and is 1 without experts); top_k <= experts.
bool expertParallelSplits(const ModelSpec &model, int64_t ep, int64_t carved);
/// The blocks of every virtual stage: an even split, or stage_layers' list; nullopt when the
/// blocks do not split into pp x chunks stages that way.
std::optional<StagePartition> partitionBlocks(int64_t blocks, int64_t pp, int64_t chunks,
                                              const std::vector<int64_t> &stageLayers);
/// The vocabulary padded to a multiple of 128 x tp (Megatron's make-vocab-size-divisible-by
/// times tp); nullopt on overflow.
std::optional<int64_t> paddedVocab(int64_t vocab, int64_t tp);

/// The mapping of a program whose parallel spec satisfies every rule, with dp already known
/// and the partition from partitionBlocks.
Mapping makeMapping(const Program &program, int64_t dp, StagePartition partition,
                    int64_t padded);

} // namespace parc

#endif
