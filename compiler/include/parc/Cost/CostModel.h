//===- CostModel.h - FLOPs, traffic and the step time of one mapping ------===//
//
// The FLOPs of a step after Narayanan et al. 2021 (generalised to grouped-query attention and
// SwiGLU), the bytes each rank sends in each process group, and the step time read off the
// simulated timeline (StepTimeline.h) with its breakdown on the stage that finishes last:
// compute, recomputation, pipeline bubble, the exposed tensor-, pipeline- and data-parallel
// communication, and the optimizer step. docs/memory-and-cost.md has every formula.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_COSTMODEL_H
#define PARC_COST_COSTMODEL_H

#include "parc/Check/Mapping.h"
#include "parc/Cost/StepTimeline.h"
#include "parc/Sema/Program.h"

#include <string>
#include <vector>

namespace parc {

/// Forward FLOPs of one transformer block for one token (matrix multiplies only).
double blockForwardFlopsPerToken(const ModelSpec &model, const LayerGroup &block);
/// The MLP weights one token's forward multiplies: the dense MLP's, or a MoE block's router,
/// top_k experts and shared experts.
double mlpWeightsPerToken(const ModelSpec &model, const LayerGroup &block);
/// Forward FLOPs of the attention core (QK^T and the product with V) of one block per token:
/// what selective recompute runs twice.
double attentionCoreFlopsPerToken(const ModelSpec &model, const LayerGroup &block);

/// The traffic of one kind of process group during a step.
struct GroupTraffic {
  std::string kind;        // "tp", "pp", "dp" or "embedding"
  std::string operations;  // what is exchanged, for the report
  int64_t ranks = 0;       // ranks in one group
  int64_t groups = 0;      // groups of this kind in the job
  bool interNode = false;  // some group of this kind spans nodes
  double bytesPerRank = 0; // bytes one rank sends per step (its busiest stage)
  double seconds = 0;      // its time on the critical stage that no compute hides
};

/// Where the step time goes, on the stage that finishes last; the parts add up to the step.
struct StepBreakdown {
  double compute = 0;   // forward and backward kernels
  double recompute = 0; // the forwards recomputation repeats
  double bubble = 0;    // the stage idle in the pipeline's fill and drain
  double tp = 0, pp = 0, dp = 0; // communication no compute hides (dp: ZeRO, gradients, tied
                                 // embedding, parameter gather)
  double cp = 0;                 // ring attention's exchange its blocks do not hide
  double ep = 0;                 // the expert-parallel all-to-alls
  double optimizer = 0;

  double total() const {
    return compute + recompute + bubble + tp + pp + dp + cp + ep + optimizer;
  }
};

struct CostEstimate {
  double tokensPerStep = 0;
  double modelFlops = 0;    // per step, whole job: forward + backward (3 forward passes)
  double hardwareFlops = 0; // per step, whole job: plus recomputation and the vocab padding
  double bubbleFraction = 0; // the schedule's (pp - 1) / (chunks x M)
  std::vector<GroupTraffic> traffic;
  StepBreakdown breakdown;
  int64_t criticalStage = 0;
  double stepSeconds = 0;
  double mfu = 0;            // model FLOPs / (step time x world x peak)
  double hfu = 0;            // hardware FLOPs / (step time x world x peak)
  double tokensPerSecond = 0;
  double trainSeconds = 0;   // train.tokens at this rate; 0 when train.tokens is not given
};

CostEstimate estimateCost(const Program &program, const Mapping &mapping,
                          const WorkTable &work, const StepTimeline &timeline);
/// Builds the work table and simulates the step; an internal error of the schedule
/// simulation leaves the estimate empty (stepSeconds 0).
CostEstimate estimateCost(const Program &program, const Mapping &mapping);

} // namespace parc

#endif
