//===- CostModel.h - FLOPs, communication volume and a step-time estimate -===//
//
// A first-order cost model of one training step: FLOPs after Narayanan et al. 2021 (generalised
// to grouped-query attention and SwiGLU), the bytes each rank sends in each process group, and
// a step time from the GPU's peak FLOP/s and the alpha-beta link model (CommModel.h) with no
// overlap of compute and communication. It is an estimate: real kernels reach a fraction of
// peak, and Megatron overlaps part of the data-parallel traffic. docs/memory-and-cost.md has
// every formula.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_COSTMODEL_H
#define PARC_COST_COSTMODEL_H

#include "parc/Check/Mapping.h"
#include "parc/Sema/Program.h"

#include <string>
#include <vector>

namespace parc {

/// Forward FLOPs of one transformer block for one token (matrix multiplies only).
double blockForwardFlopsPerToken(const ModelSpec &model, const LayerGroup &block);
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
  double seconds = 0;      // alpha-beta time per step on the critical path
};

struct CostEstimate {
  double tokensPerStep = 0;
  double modelFlops = 0;    // per step, whole job: forward + backward (3 forward passes)
  double hardwareFlops = 0; // per step, whole job: plus recomputation and the vocab padding
  double bubbleFraction = 0;
  std::vector<GroupTraffic> traffic;
  double computeSeconds = 0; // the busiest stage's compute per step at peak, bubble included
  double stepSeconds = 0;    // estimate: compute + tp + pp + dp + embedding sync, no overlap
  double mfu = 0;            // model FLOPs / (step time * world * peak)
};

CostEstimate estimateCost(const Program &program, const Mapping &mapping);

} // namespace parc

#endif
