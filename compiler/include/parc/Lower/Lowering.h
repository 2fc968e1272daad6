//===- Lowering.h - Program + Mapping -> one execution plan per rank ------===//
//
// Runs after the feasibility checks (it relies on every divisibility rule holding) and never
// reports user errors: a plan that fails verification is an internal error.
//
// What the plans hold, beyond what docs/plan-format.md fixes:
//  * Parameters follow Megatron-LM's tensor-parallel layouts, with q, k and v as separate
//    column-parallel projections so that every shard is a contiguous slice of a tensor whose
//    layout does not depend on tp. With kv_heads < tp, the tp / kv_heads ranks whose query
//    heads share a key/value head each hold a copy of it; the backward all-gathers their
//    partial gradients over tp and adds those of the sharing ranks, and only the first copy
//    counts in the gradient norm. SwiGLU's gate and up projections are fused as in Megatron,
//    each tp rank's rows being its gate rows then its up rows. Biases exist iff the model uses
//    LayerNorm, as in the memory model. ParamLowering.cpp has the details.
//  * Tensor names: "block.3.attn.q", the gradient of x is "x.grad", parts of a gradient summed
//    from several paths carry a further suffix, recomputed activations ".re".
//  * Recompute is explicit in the backward lists: selective reruns each block's attention
//    from its saved q, k, v; full reruns the block from its input up to the MLP activation.
//  * The schedule reduces gradients over tp (sequence-parallel replicated parameters), then
//    the embedding group, then dp; each chunk's parameters form one ZeRO partition.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_LOWER_LOWERING_H
#define PARC_LOWER_LOWERING_H

#include "parc/Check/Mapping.h"
#include "parc/Plan/Plan.h"
#include "parc/Sema/Program.h"
#include "parc/Support/Diagnostics.h"

#include "llvm/Support/Error.h"

namespace parc {

/// Reports, at the field, what a job may describe for its estimates but the plans cannot
/// express (dropout: parrun has no random masks; GeGLU, tanh GELU, parallel residuals, partial
/// rotary embeddings, embedding scaling: no kernels or lowering; mixture-of-experts blocks
/// under context or expert parallelism, or with a capacity factor: not lowered yet).
/// Returns true when the job can be lowered.
bool checkLowerable(const Program &program, const Mapping &mapping, DiagnosticEngine &diags);

/// The plan id of a job. Every rank plan is a pure function of the job description (model,
/// cluster, mapping, training settings, format version) and its rank, so hashing that
/// description identifies the whole set of rank plans; it is what lets `--rank=R` print one
/// rank's plan, id included, without lowering the other ranks.
std::string computeJobPlanId(const Program &program, const Mapping &mapping);

/// The manifest (job summary and rank file list) for `planId`.
plan::Manifest buildManifest(const Program &program, const Mapping &mapping,
                             llvm::StringRef planId);

/// One rank's plan, without lowering any other rank.
plan::RankPlan lowerRank(const Program &program, const Mapping &mapping, int64_t rank,
                         llvm::StringRef planId);

/// Every rank's plan, verified together: each plan passes plan::verifyRankPlan, and the
/// schedules of all ranks, simulated with blocking send/recv, match every send with exactly one
/// receive and never deadlock. A failure is an internal compiler error.
llvm::Expected<std::vector<plan::RankPlan>> lowerAllRanks(const Program &program,
                                                          const Mapping &mapping);

/// What lowerAllRanks proves of the plans it built (indexed by rank): each passes
/// plan::verifyRankPlan, they pass plan::verifyPlanSet with buildManifest's manifest, and
/// their schedules run together to the end: the pipeline transfers of each pp group in
/// ScheduleVerifier's rendezvous simulation, the collectives of each group met by all its
/// members in the same order. Errors start with "internal error: ".
llvm::Error verifyLoweredPlans(const Program &program, const Mapping &mapping,
                               llvm::ArrayRef<plan::RankPlan> plans);

} // namespace parc

#endif
