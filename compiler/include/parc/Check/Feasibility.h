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

/// tp splits every layer group's heads, key/value heads (or replicates whole ones) and ffn.
bool tensorParallelSplits(const ModelSpec &model, int64_t tp);
/// Sequence parallelism needs tp > 1 and seq a multiple of tp.
bool sequenceParallelSplits(const ModelSpec &model, int64_t tp);
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
