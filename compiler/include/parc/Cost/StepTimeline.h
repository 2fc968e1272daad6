//===- StepTimeline.h - The simulated training step, one timeline ---------===//
//
// The step time of parc: the lowering's pipeline schedule (Schedule.h) run through the schedule
// simulation with the work table's per-microbatch forward and backward times (compute, the
// exposed tensor-parallel collectives and ZeRO traffic, recomputation) and its pipeline
// transfer time, then on every stage the data-parallel gradient synchronisation (behind the
// last backward of each chunk when overlap_grad_reduce is set, after the pipeline otherwise),
// the tied-embedding sync, the optimizer step and the parameter all-gather (hidden behind the
// next step's first forward when overlap_param_gather is set). The report, the pipeline SVG
// and the Chrome trace all read this one timeline.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_STEPTIMELINE_H
#define PARC_COST_STEPTIMELINE_H

#include "parc/Check/Mapping.h"
#include "parc/Cost/StageWork.h"
#include "parc/Lower/Schedule.h"
#include "parc/Sema/Program.h"

#include "llvm/Support/Error.h"

#include <vector>

namespace parc {

/// One instruction of a stage with its simulated interval in seconds (OpTiming's meaning: a
/// transfer starts when its stage posted it and includes the wait for its peer).
struct TimedOp {
  PipeOp op;
  double start = 0, end = 0;
  /// Of a compute: the exposed tensor-parallel and ZeRO communication inside [start, end).
  double tpSeconds = 0, zeroSeconds = 0;
};

/// What a stage does after its last pipeline instruction; intervals in seconds, empty ones
/// have start == end.
struct StageTail {
  double pipelineEnd = 0;
  double gradSyncStart = 0, gradSyncEnd = 0;         // may start before pipelineEnd (overlap)
  double embeddingSyncStart = 0, embeddingSyncEnd = 0;
  double optimizerStart = 0, optimizerEnd = 0;
  double paramGatherStart = 0, paramGatherEnd = 0;   // its exposed part only
  double end = 0;                                     // when the stage is done with the step
};

struct StepTimeline {
  PipelineConfig config;
  /// Indexed by stage, in program order; empty unless simulated with its instructions.
  std::vector<std::vector<TimedOp>> stages;
  std::vector<StageTail> tails;
  /// The pipeline alone, and the whole step (the slowest stage's tail end).
  double pipelineMakespan = 0, makespan = 0;
  /// The same pipeline with free transfers: the difference is the exposed pp communication.
  double pipelineWithoutTransfers = 0;
  /// One microbatch through one virtual stage, indexed by virtual stage.
  std::vector<double> forwardSeconds, backwardSeconds;
  /// One activation or gradient message between neighbouring stages; 0 when pp is 1.
  double transferSeconds = 0;
  double messageBytes = 0;
  /// (pp - 1) / (chunks * M): the schedule's bubble relative to its compute time.
  double idealBubble = 0;

  /// Compute time of `stage`: what it would take without any bubble.
  double busySeconds(int64_t stage) const;
  /// The bubble the simulation shows: how much longer the pipeline is than the busiest
  /// stage's compute, relative to that compute (comparable with idealBubble).
  double simulatedBubble() const;
  /// The stage whose tail ends last, which sets the step time.
  int64_t criticalStage() const;
};

/// Simulates the step of a mapping that passed the feasibility checks; `withOps` keeps every
/// instruction's interval (what the trace and the diagram draw). An error means the schedule
/// deadlocked, which is an internal compiler error.
llvm::Expected<StepTimeline> simulateStep(const Program &program, const Mapping &mapping,
                                          const WorkTable &work, bool withOps);
/// The same with the instructions, from a fresh work table.
llvm::Expected<StepTimeline> simulateStep(const Program &program, const Mapping &mapping);

/// A bound the simulated step never beats, in O(pp x chunks): stage s starts after the first
/// microbatch's forwards through the virtual stages before it, runs its own passes, and its
/// last backward's gradient still flows back through them to stage 0; every stage then runs
/// the part of its tail nothing overlaps. Equal to the simulation for a pipeline of equal
/// stages. The search ranks by it and simulates in its order.
double stepLowerBound(const Program &program, const Mapping &mapping, const WorkTable &work);

} // namespace parc

#endif
