//===- StepTimeline.h - When each pipeline instruction of a step runs -----===//
//
// The timed run of one training step that the trace and the pipeline diagram draw: the stage
// programs of Schedule.h, with each compute costed from its FLOPs at the GPU's peak and each
// pipeline transfer from the alpha-beta send time over the pp group's link, run through the
// schedule verifier's simulation. Tensor-parallel collectives, data-parallel traffic and the
// optimizer are left out: the picture is the pipeline, as in the GPipe and Megatron figures.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_EMIT_STEPTIMELINE_H
#define PARC_EMIT_STEPTIMELINE_H

#include "parc/Check/Mapping.h"
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
};

struct StepTimeline {
  PipelineConfig config;
  /// Indexed by stage, in program order.
  std::vector<std::vector<TimedOp>> stages;
  double makespan = 0;
  /// One microbatch through one virtual stage, indexed by virtual stage.
  std::vector<double> forwardSeconds, backwardSeconds;
  /// One activation or gradient message between neighbouring stages; 0 when pp is 1.
  double transferSeconds = 0;
  double messageBytes = 0;
  /// (pp - 1) / (chunks * M): the schedule's bubble relative to its compute time.
  double idealBubble = 0;

  /// Compute time of `stage`: what it would take without any bubble.
  double busySeconds(int64_t stage) const;
  /// The bubble the simulation shows: how much longer the step is than the busiest stage's
  /// compute, relative to that compute (comparable with idealBubble).
  double simulatedBubble() const;
};

/// Per virtual stage forward and backward seconds of one microbatch at peak FLOP/s.
void computeVirtualStageSeconds(const Program &program, const Mapping &mapping,
                                std::vector<double> &forward, std::vector<double> &backward);

/// Simulates the step of a mapping that passed the feasibility checks. An error means the
/// schedule failed verification, which is an internal compiler error.
llvm::Expected<StepTimeline> simulateStep(const Program &program, const Mapping &mapping);

} // namespace parc

#endif
